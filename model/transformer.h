// The decoder-only transformer with Mixture-of-Depths routing: embedding, blocks (dense and
// routed, model/block.h), final norm and LM head; the forward in top-C (training) or causal
// (per-token: evaluation, sampling) routing, and one-token decoding through per-block KV caches.
// Shape legend: B batch, T tokens, D width, V vocabulary, C routed capacity.
//
// Causal routing (sampling, causal eval) decides per token from that token's input alone.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/backend.h"
#include "core/nn/module.h"
#include "model/block.h"
#include "model/forward_result.h"
#include "model/sequence_split.h"

namespace mod::model {

// Batched decoding (decode.cpp): B sequences, each at its own position with its own static KV
// caches, all on the model's device. A step feeds every sequence's current token; the token
// after it is the prompt's where the prompt goes on, else the one sampled. Shape legend: B
// sequences, L token buffer (the caches' capacity too).
struct DecodeState {
  int64_t batch = 0, length = 0;  // B, L
  int64_t eot = -1;               // a generated eot ends its sequence; < 0: none
  Tensor tokens;                  // i64 [B,L]: each prompt (right-padded), then its new tokens
  Tensor prompt_len, stop;        // i64 [B]: prompt tokens; the last position a sequence feeds + 1
  Tensor pos, cur, active;        // i64 [B]: the position and token fed next, 1 until done
  std::vector<KvCache> caches;    // per block, static kind (model/layers.h)
};

// Hooks at the boundaries of the model's parameter units, for sharding them (ZeRO-3,
// parallel/zero3.h): a unit is one block, or the outer unit (embedding, final norm, head).
// forward() calls begin_forward before it reads any parameter and end_forward after the loss;
// enter_block(b) before block b reads its parameters; leave_block(b, x, aux) after block b with
// the stream and the aux loss so far (undefined if none), and continues with what it returns
// (an identity whose backward comes before every backward of the block's ops).
struct UnitHooks {
  std::function<void()> begin_forward, end_forward;
  std::function<void(size_t block)> enter_block;
  std::function<std::pair<Tensor, Tensor>(size_t block, const Tensor& x, const Tensor& aux)>
      leave_block;
};

class Transformer : public nn::Module {
 public:
  // dtype F64 serves the gradient checks; training runs in F32 on the CPU. fusions: the fused
  // ops to run (train.fusions, model/fusions.h).
  Transformer(const modtrain::ModelConfig& cfg, uint64_t seed, DType dtype = DType::F32,
              Fusions fusions = {});

  // tokens, targets [B,T] (i64); targets may be undefined (no loss).
  ForwardResult forward(const Tensor& tokens, const Tensor& targets,
                        RoutingMode mode = RoutingMode::TopC) const;

  // A pipeline stage's share of a top-C forward (parallel/pipeline_runtime.h): blocks
  // [first, end) on x [B,T,D], or on the embedding of tokens [B,T] when first == 0 (x is then
  // ignored; tokens gives T on every stage); the final norm, head and loss when end ==
  // num_blocks() and targets are defined. result.hidden is the blocks' output [B,T,D] when end <
  // num_blocks(); result.loss is this stage's part of the loss (its routed blocks' aux_loss, plus
  // lm_loss on the last stage). Under a sequence split x and hidden are [B,T/n,D].
  ForwardResult forward_stage(const Tensor& tokens, const Tensor& x, size_t first, size_t end,
                              const Tensor& targets) const;

  // Sampling: feeds one token at `pos` through the caches (one per block) -> logits [V].
  Tensor decode_step(int64_t token, int64_t pos, std::vector<KvCache>& caches) const;
  std::vector<KvCache> make_caches(int64_t max_len) const;
  // Batched decoding: prompts (each non-empty, stop[b] <= L <= model.seq_len) and the last
  // position + 1 each sequence feeds; then one step per position, all on the device: every
  // active sequence's token through the blocks (a routed block admits it iff its decision logit
  // is positive: its cache grows and its residual updates only then), the next token drawn by
  // sample_tokens (core/ops/decode.h) and the state advanced. No host reads: capturable.
  DecodeState make_decode_state(const std::vector<std::vector<int64_t>>& prompts,
                                const std::vector<int64_t>& stop, int64_t length,
                                int64_t eot) const;
  void decode_batch_step(DecodeState& state, const SampleArgs& args) const;

  const modtrain::ModelConfig& config() const { return cfg_; }
  bool routed(size_t block) const { return routed_[block]; }
  size_t num_blocks() const { return blocks_.size(); }
  MoeMlp* moe(size_t block) const { return blocks_[block]->moe(); }  // null: dense MLP
  // Replaces cross_entropy(logits, targets) for the LM loss (the vocabulary-parallel loss under
  // tensor parallelism, where logits hold this rank's slice of the vocabulary).
  using LmLoss = std::function<Tensor(const Tensor& logits, const Tensor& targets)>;
  void set_lm_loss(LmLoss fn) { lm_loss_ = std::move(fn); }
  // Sequence parallelism: the embedding's hook returns [B,T/n,D] and the stream stays split
  // until the head's input hook gathers it; routed blocks move rows and scores through `split`.
  void set_sequence_split(SequenceSplit split) {
    split_ = std::make_shared<SequenceSplit>(std::move(split));
  }
  // The positions of a sequence of seq_len the stream between blocks holds: seq_len, or
  // seq_len / n under a split (a pipeline stage's input and output, forward_stage).
  int64_t stream_length(int64_t seq_len) const { return split_ ? seq_len / split_->parts : seq_len; }
  // train.fusions.classifier: with targets, forward computes the LM loss with
  // linear_cross_entropy (core/ops/loss.h) and returns no logits. Off until set; ignored while
  // an LmLoss is set (tensor parallelism) and without targets (sampling, inspection).
  void set_fused_classifier(bool on) { fused_classifier_ = on; }
  bool fused_classifier() const { return fused_classifier_; }
  // train.recompute and train.recompute_blocks (empty: every block): what the blocks keep for
  // backward (model/block.h). NONE until set.
  void set_recompute(Recompute mode, const std::vector<int>& blocks = {});
  // See UnitHooks. A block's parameters are then present only while it runs, so no block's add
  // fuses the next block's norm (norm_after).
  void set_unit_hooks(UnitHooks hooks) { units_ = std::make_shared<UnitHooks>(std::move(hooks)); }
  Recompute recompute(size_t block) const { return recompute_[block]; }

 private:
  // The blocks in order; with fuse_final_norm, the final norm of the result too where the last
  // block's residual add can make it (Residual::normed).
  // Blocks [first, end) only: a pipeline stage's (forward_stage).
  Residual run_blocks(Tensor x, int64_t seq_len, RoutingMode mode, ForwardResult& result,
                      bool fuse_final_norm, size_t first, size_t end) const;
  // The norm a fused add + norm makes at the end of dense block b, or null (see run_blocks);
  // none at a stage's end (end < the number of blocks): the next stage gets x alone.
  const nn::Norm* norm_after(size_t b, bool fuse_final_norm, size_t end) const;
  // result's logits (or fused loss), lm_loss and loss from the last block's output x.
  void head_and_loss(ForwardResult& result, const Tensor& x, const Tensor& normed,
                     const Tensor& targets) const;
  // Routed block b under top-C routing (with its causal-decision loss) or causal routing; both
  // update x through routed_update (model/block.h), as decode_step does. pos [B,T] covers every
  // position, x only its own under a sequence split.
  Tensor top_c_block(size_t b, const Tensor& x, const Tensor& pos, ForwardResult& result) const;
  Tensor causal_block(size_t b, const Tensor& x, const Tensor& pos, ForwardResult& result) const;
  // final norm + LM head; `normed`, when defined, is final_norm(h) already made.
  Tensor head(const Tensor& h, const Tensor& normed = Tensor()) const;
  // Throws unless routed blocks have a trained causal decision (causal.method not NONE).
  void require_causal_decision(const char* what) const;
  const Tensor& positions(int64_t b, int64_t t, Device device) const;  // [B,T]: 0..T-1 per row
  int64_t capacity(size_t block, int64_t seq_len) const;

  modtrain::ModelConfig cfg_;
  std::vector<bool> routed_;  // per block
  std::vector<bool> moe_;     // per block: an MoE MLP
  std::vector<double> capacity_fractions_;  // per block: 1 when dense
  std::vector<Recompute> recompute_;  // per block
  Fusions fusions_;
  std::shared_ptr<nn::Embedding> embed_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<nn::Norm> final_norm_;
  std::shared_ptr<nn::Linear> lm_head_;  // null when tied
  LmLoss lm_loss_;                       // null: cross_entropy
  std::shared_ptr<SequenceSplit> split_;  // null: the stream holds every position
  bool fused_classifier_ = false;        // set_fused_classifier
  std::shared_ptr<UnitHooks> units_;     // null: parameters are always present
  mutable std::deque<Tensor> positions_;  // positions() made so far (references stay valid)
};

}  // namespace mod::model
