// Peak memory per rank, predicted from the config: parameters (ZeRO-3: this rank's slices plus
// the outer unit and the largest block gathered whole), gradients, AdamW state (sharded
// over dp from ZeRO stage 1 on), the activations each block keeps for backward (a routed block keeps
// them for its C tokens only), the compute-dtype weight copies autocast keeps, and the largest
// temporary; the peak is found by walking backward block by block, as the autograd engine frees
// each block's saved tensors and adds its gradients. docs/memory.md has the formula.
// Shape legend: B sequences per rank, T tokens, C routed capacity, D width, F MLP width,
// V vocabulary, H heads.
//
// The per-op terms come from what each op's backward saves (core/ops/*.cpp); the shapes from
// the model's own rules (routed_blocks, moe_blocks, block_capacity, expert_slots). A test
// checks the prediction against the CPU allocator's measured peak (tests/model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::model {

// Activation recomputation (train.recompute): NONE keeps what every op's backward saves; FULL
// keeps only each recomputed block's input (routed blocks: r, the top-C indices and the
// gathered rows) and reruns the block in backward; SELECTIVE keeps the input and the outputs of
// the GEMMs and attention and reruns the cheap ops between them.
using Recompute = modtrain::TrainConfig::Recompute;  // as model/block.h

struct MemoryLayout {
  int tp = 1, dp = 1, ep = 1;
  int zero_stage = 0;  // parallel.zero_stage (config::zero_stage)
  double bucket_mb = 25;  // parallel.bucket_mb: ZeRO-2 holds about two buckets of full gradients
  // parallel.sequence_parallel (tp > 1): the norm and residual regions keep T/tp positions; the
  // gathered inputs of the column-parallel layers are still kept whole.
  bool sequence_parallel = false;
};

struct MemoryOptions {
  MemoryLayout layout;
  int64_t batch_per_rank = 1;  // sequences per micro-batch on one dp rank
  int grad_accum = 1;          // train.grad_accum: above 1, ZeRO-2 keeps full gradients too
  bool bf16 = false;           // compute in bf16 from f32 masters (train.precision BF16)
  Recompute recompute = modtrain::TrainConfig::NONE;
  std::vector<int> recompute_blocks;  // empty: every block
  // train.fusions.classifier at tp 1: the LM head and its loss as linear_cross_entropy
  // (core/ops/loss.h), which keeps dx and dW instead of logits.
  bool fused_classifier = false;
  // train.fusions.router_scores: under bf16 the router reads (and keeps) the block input as it
  // is, not an f32 copy (core/ops/matmul.h row_scores).
  bool fused_router_scores = false;
  // train.fusions.optimizer_weight_copies under bf16: the optimizer keeps bf16 weight copies,
  // into which ZeRO-3 gathers each unit's copy part (parallel/zero3.h), the masters of that
  // part never whole.
  bool weight_copies = false;
};

// train.batch_size / dp, precision, recomputation and the parallel layout of a run config.
MemoryOptions memory_options(const modtrain::RunConfig& cfg);

struct BlockMemory {
  int block = 0;
  bool routed = false, moe = false, recomputed = false;
  int64_t tokens = 0;       // per sequence through the block's layers (C when routed)
  double kept = 0;          // bytes saved for backward from forward to this block's backward
  double backward_temp = 0; // bytes its backward allocates on top (recomputed forward included)
  double parameters = 0;    // bytes of its parameters on this rank (tp/ep shards, master dtype)
  double expert_parameters = 0;  // of which its experts' (sharded over edp, not dp)
};

struct MemoryPlan {
  double parameters = 0;    // bytes, this rank's shards, master dtype (ZeRO-3: + gathered units)
  double gradients = 0;     // bytes after backward (master dtype; ZeRO-2: the owned slices)
  double optimizer = 0;     // AdamW m and v (/dp under ZeRO-1)
  double weight_copies = 0; // compute-dtype copies of weights kept for backward (bf16 only)
  double head_kept = 0;  // final norm, logits, loss (the embedding output is block 0's input)
  double head_backward_temp = 0;             // dlogits and the LM head's weight gradient
  double head_forward_temp = 0;  // the fused LM head's chunk of logits and buffers while it runs
  double embedding_parameters = 0;  // bytes, this rank's vocabulary rows (master dtype)
  double head_parameters = 0;       // the final norm and an untied LM head (tied: none)
  double stream_grad = 0;           // the residual stream's gradient between blocks [n, D]
  double embedding_backward_temp = 0;  // the table's gradient and the stream's in master dtype
  std::vector<BlockMemory> blocks;
  double activations = 0;        // everything kept at the end of forward (weight copies too)
  double largest_temporary = 0;  // the largest backward_temp (head's included)
  double peak = 0;
  std::string peak_at;              // where the peak falls, e.g. "backward of block 3"
  std::vector<std::string> notes;   // what is approximate or not modelled
};

MemoryPlan plan_memory(const modtrain::ModelConfig& cfg, const MemoryOptions& opt);

// The ranks that hold the same experts and shard their ZeRO state (and reduce their gradients):
// dp / ep replicas times the tp ranks.
int expert_shard_ranks(const MemoryLayout& layout);

// What data parallelism and ZeRO keep for the parameters a rank reduces (dense_bytes over dp,
// expert_bytes over expert_shard_ranks; master dtype), by parallel.zero_stage.
struct ReducedState {
  double owned = 0;      // the rank's slices: dense /dp, experts /edp
  double optimizer = 0;  // AdamW's m and v: of every element, or from stage 1 of the owned ones
  double buckets = 0;    // flat gradient buckets (stage 1: and the owned block; stage 2: that alone)
  bool releases = false; // stage 2: every full gradient is dropped once its bucket is packed
};
ReducedState reduced_state(const MemoryLayout& layout, double dense_bytes, double expert_bytes);
// ZeRO-3's parameter bytes on a rank (parallel/zero3.h): its slices (dense_bytes over dp,
// expert_bytes over expert_shard_ranks), the outer unit whole through the step (outer_bytes, part
// of dense_bytes; its masters that are whole), and one block whole with the next one's
// all-gather in flight (units_bytes).
double zero3_parameters(const MemoryLayout& layout, double dense_bytes, double expert_bytes,
                        double outer_bytes, double units_bytes);
// units_bytes when every member gathers in f32: a block whole, the next one's receive buffer (a
// block) and its send buffer (1/dp of one); largest_block_bytes bounds them. Under bf16 weight
// copies plan_memory counts the copy part at 2 bytes and its masters never whole instead.
double zero3_f32_units(const MemoryLayout& layout, double largest_block_bytes);
MemoryPlan plan_memory(const modtrain::RunConfig& cfg);

// The `memory` command's table (bytes shown in MiB/GiB).
std::string describe_memory(const MemoryPlan& plan, const MemoryOptions& opt);
std::string format_bytes(double bytes);  // e.g. "1.25 GiB", "310.4 MiB"

}  // namespace mod::model
