// Peak memory prediction (see memory_plan.h). Each term names the op whose backward saves it.
#include "model/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>

#include "configs/config.h"
#include "core/ops/loss.h"
#include "model/moe_routing.h"
#include "model/routing_schedule.h"

namespace mod::model {

namespace {
using modtrain::CausalRoutingConfig;
using modtrain::ModelConfig;

constexpr double kMaster = 4;  // f32 master weights, gradients and AdamW moments
constexpr double kStats = 4;   // f32 statistics: a norm's rstd (and mean), attention lse, losses

// The shapes one rank sees: heads, MLP hidden units and vocabulary split over tp.
struct Dims {
  double d, w, f, h, v, fe, e_all, experts_local, a;  // a: compute dtype bytes
  double norm_vecs, norm_stats;  // per norm: [D] parameters (gain, bias), [rows] statistics
  bool swiglu, bf16;
  int tp;
  double seq_share;  // the share of positions the residual stream holds: 1/tp under SP, else 1
};

Dims dims_of(const ModelConfig& cfg, const MemoryOptions& opt) {
  const auto& me = cfg.moe();
  Dims x{};
  x.tp = opt.layout.tp;
  x.seq_share = opt.layout.sequence_parallel && x.tp > 1 ? 1.0 / x.tp : 1.0;
  x.d = cfg.d_model();
  x.w = x.d / x.tp;
  x.f = static_cast<double>(cfg.d_ff()) / x.tp;
  x.h = static_cast<double>(cfg.n_heads()) / x.tp;
  x.v = static_cast<double>(cfg.vocab_size()) / x.tp;
  x.fe = me.d_expert() > 0 ? me.d_expert() : cfg.d_ff();
  x.e_all = me.n_experts() + (me.noop_expert() ? 1 : 0);
  x.experts_local = static_cast<double>(me.n_experts()) / opt.layout.ep;
  x.bf16 = opt.bf16;
  x.a = opt.bf16 ? 2 : 4;
  x.swiglu = cfg.mlp() == ModelConfig::SWIGLU;
  const bool layer_norm = cfg.norm() == ModelConfig::LAYER;  // a bias; the mean besides rstd
  x.norm_vecs = x.norm_stats = layer_norm ? 2 : 1;
  return x;
}

double mlp_mats(const Dims& x) { return x.swiglu ? 3 : 2; }

// Parameter elements of block b on one rank (the layer constructors' shapes, model/layers.cpp,
// model/moe.cpp; tp splits attention and the dense MLP, ep the experts).
double block_param_elems(const ModelConfig& cfg, const Dims& x, bool routed, bool moe) {
  double n = 2 * x.norm_vecs * x.d + 4 * x.d * x.w;  // norm1, norm2; wq, wk, wv, wo
  if (moe)
    n += x.experts_local * mlp_mats(x) * x.fe * x.d + x.e_all * x.d +
         (cfg.moe().router_bias() ? x.e_all : 0);
  else
    n += mlp_mats(x) * x.d * x.f;
  if (routed) {
    n += x.d + (cfg.mod().router().bias() ? 1 : 0);
    if (cfg.mod().causal().method() == CausalRoutingConfig::PREDICTOR) {
      const double hid = cfg.mod().causal().predictor_hidden();
      n += x.d * hid + hid + hid + 1;
    }
  }
  return n;
}

// The largest single weight of a block (its gradient is the largest one-piece temporary).
double largest_block_weight(const Dims& x, bool moe) {
  return moe ? x.experts_local * x.fe * x.d : std::max(x.d * x.w, x.d * x.f);
}

// Elements of block b that forward reads as f32 masters even under bf16 (model::read_as_master:
// MoD's router, the predictor's logit layer, MoE's router); ZeRO-3 gathers the others in bf16.
double block_master_read_elems(const ModelConfig& cfg, const Dims& x, bool routed, bool moe) {
  double n = moe ? x.e_all * x.d + (cfg.moe().router_bias() ? x.e_all : 0) : 0;
  if (routed) {
    n += x.d + (cfg.mod().router().bias() ? 1 : 0);
    if (cfg.mod().causal().method() == CausalRoutingConfig::PREDICTOR)
      n += cfg.mod().causal().predictor_hidden() + 1;
  }
  return n;
}

// Bytes of the compute-dtype weight copies autocast makes and the block's matmuls keep
// (bf16 only; in f32 autocast hands back the master itself).
double block_weight_copies(const Dims& x, bool moe) {
  if (!x.bf16) return 0;
  const double mlp = moe ? x.experts_local * mlp_mats(x) * x.fe * x.d : mlp_mats(x) * x.d * x.f;
  return x.a * (2 * x.norm_vecs * x.d + 4 * x.d * x.w + mlp);
}

// What the block's delta f saves for backward on n tokens (n = rows of all sequences):
// a norm keeps its input and rstd, and LayerNorm its mean (x, h1); the q/k/v/o matmuls their
// input (n1); rope nothing but positions, so attention's q, k, v and output are the four
// [n, D/tp] tensors; the MLP matmuls their inputs (n2; the activation's input and output);
// attention's lse. share: of the norms' inputs and statistics (x and x + a, the residual
// region), the part held: 1/tp for a dense block under sequence parallelism, where the norms'
// outputs are gathered whole for the matmuls that keep them.
double delta_kept(const ModelConfig& cfg, const Dims& x, double n, int64_t tokens_per_seq,
                  bool moe, double sequences, double share = 1) {
  double kept = n * x.a * ((2 + 2 * share) * x.d + 4 * x.w) +
                n * kStats * (2 * x.norm_stats * share + x.h);
  if (!moe) return kept + n * x.a * mlp_mats(x) * x.f;
  // MoE: router softmax output and the z-loss's logsumexp input [n, E']; every slot's gathered
  // row (expert input), hidden activations and output, and its gate (model/moe.cpp).
  const double slots = sequences * cfg.moe().n_experts() *
                       static_cast<double>(expert_slots(cfg.moe(), tokens_per_seq));
  kept += 2 * n * x.e_all * x.a;
  kept += slots * x.a * (x.d + 1) + slots / x.tp * x.a * (x.d + mlp_mats(x) * x.fe);
  return kept;
}

// What the delta's backward allocates at its widest, beyond what it keeps: the residual
// gradients (2 [n,D]); in the MLP the activation's gradients (k of them) less its output, which
// the down projection's backward has freed; in attention dq, dk, dv and the output's gradient,
// by when the MLP's kept tensors are gone. Plus the largest weight gradient (and its f32 copy
// under bf16).
double delta_backward_temp(const Dims& x, double n, bool moe, double slots_per_rank) {
  const double mlp_width = moe ? slots_per_rank / std::max(n, 1.0) * x.fe : x.f;
  const double mlp = (mlp_mats(x) - 1) * mlp_width;
  const double attention = 4 * x.w - mlp_mats(x) * mlp_width - 2 * x.d;
  const double act = n * x.a * (2 * x.d + std::max(mlp, attention));
  const double wgrad = largest_block_weight(x, moe) * (x.a + (x.bf16 ? kMaster : 0));
  return act + wgrad;
}

// Under SELECTIVE a region keeps its input and the outputs of its GEMMs and attention: q, k, v
// and attention's output [n, D/tp] with its lse, the projections' outputs [n, D], the MLP's
// GEMM outputs; the norms, RoPE and activations between them are recomputed.
double delta_selective_kept(const ModelConfig& cfg, const Dims& x, double n,
                            int64_t tokens_per_seq, bool moe, double sequences) {
  double kept = n * x.a * (x.d + 4 * x.w + 2 * x.d) + n * kStats * x.h;
  if (!moe) return kept + n * x.a * (mlp_mats(x) - 1) * x.f;
  const double slots = sequences * cfg.moe().n_experts() *
                       static_cast<double>(expert_slots(cfg.moe(), tokens_per_seq));
  return kept + n * x.e_all * x.a + slots / x.tp * x.a * (mlp_mats(x) - 1) * x.fe;
}

// What SELECTIVE keeps that the recomputation reuses instead of making again: the input,
// v and attention's output with lse, and the MLP activation's inputs.
double selective_shared(const Dims& x, double n, bool moe) {
  return n * x.a * (x.d + 2 * x.w + (moe ? 0 : (mlp_mats(x) - 1) * x.f)) + n * kStats * x.h;
}

// Per block, in one pass over the list (a lookup per block would be quadratic).
std::vector<bool> recomputed_blocks(const MemoryOptions& opt, int n_layers) {
  std::vector<bool> out(n_layers, opt.recompute != modtrain::TrainConfig::NONE &&
                                      opt.recompute_blocks.empty());
  if (opt.recompute != modtrain::TrainConfig::NONE)
    for (int b : opt.recompute_blocks) out[b] = true;
  return out;
}
}  // namespace

// train.recompute and train.recompute_blocks are not read here yet: they come with the
// recomputation branch (set MemoryOptions::recompute from them when both are merged).
MemoryOptions memory_options(const modtrain::RunConfig& cfg) {
  MemoryOptions o;
  const auto& p = cfg.parallel();
  o.layout = {std::max(1, p.tp()), std::max(1, p.dp()), std::max(1, p.ep()),
              config::zero_stage(p), p.bucket_mb(), p.sequence_parallel()};
  o.grad_accum = std::max(1, cfg.train().grad_accum());
  o.batch_per_rank = std::max<int64_t>(1, cfg.train().batch_size() / o.layout.dp);
  o.bf16 = cfg.train().precision() == modtrain::TrainConfig::BF16;
  o.recompute = cfg.train().recompute();
  o.recompute_blocks.assign(cfg.train().recompute_blocks().begin(),
                            cfg.train().recompute_blocks().end());
  o.fused_classifier = cfg.train().fusions().classifier() && o.layout.tp == 1;
  o.fused_router_scores = cfg.train().fusions().router_scores();
  o.weight_copies = o.bf16 && cfg.train().fusions().optimizer_weight_copies();
  return o;
}

int expert_shard_ranks(const MemoryLayout& l) { return std::max(1, l.dp / l.ep) * l.tp; }

ReducedState reduced_state(const MemoryLayout& l, double dense, double experts) {
  const double dp = l.dp, edp = expert_shard_ranks(l);
  ReducedState r;
  r.owned = dense / dp + experts / edp;
  const bool sharded = l.zero_stage >= 1, released = l.zero_stage >= 2;
  r.optimizer = 2 * (sharded ? r.owned : dense + experts);
  // dp > 1: every gradient is also packed into a flat all-reduce bucket (parallel/data_parallel);
  // expert gradients too when edp > 1 or they need dividing by dp (parallel/parallelize.cpp).
  // ZeRO-1's buckets also hold this rank's reduce-scattered block: 1/dp (experts 1/edp) more.
  // ZeRO-2 keeps only that block: a packed buffer lives from packing to its reduce's end.
  const double flat = released ? 0 : 1;
  const double dense_share = sharded ? flat + 1 / dp : 1, expert_share = sharded ? flat + 1 / edp : 1;
  const bool dense_buckets = l.dp > 1, expert_buckets = experts > 0 && (l.dp > 1 || edp > 1);
  r.buckets = (dense_buckets ? dense * dense_share : 0) + (expert_buckets ? experts * expert_share : 0);
  r.releases = released && dense_buckets && (experts == 0 || expert_buckets);
  return r;
}

double zero3_parameters(const MemoryLayout& l, double dense, double experts, double outer,
                        double units) {
  return dense / l.dp + experts / expert_shard_ranks(l) + outer + units;
}

double zero3_f32_units(const MemoryLayout& l, double largest_block) {
  return (2 + 1.0 / l.dp) * largest_block;
}

MemoryPlan plan_memory(const modtrain::RunConfig& cfg) {
  return plan_memory(cfg.model(), memory_options(cfg));
}

MemoryPlan plan_memory(const ModelConfig& cfg, const MemoryOptions& opt) {
  for (int b : opt.recompute_blocks)
    if (b < 0 || b >= cfg.n_layers())
      throw std::invalid_argument("recompute blocks: " + std::to_string(b) +
                                  " is not a block in [0, " + std::to_string(cfg.n_layers()) + ")");
  const Dims x = dims_of(cfg, opt);
  const auto routed = routed_blocks(cfg), moe = moe_blocks(cfg);
  const auto capacities = block_capacities(cfg);
  const auto recomputed = recomputed_blocks(opt, cfg.n_layers());
  const double bs = static_cast<double>(opt.batch_per_rank), t = cfg.seq_len(), n = bs * t;
  const auto& causal = cfg.mod().causal();
  const bool predictor = cfg.mod().enabled() && causal.method() == CausalRoutingConfig::PREDICTOR;
  MemoryPlan plan;

  // Parameters, in master precision. Embedding (and an untied head) split over the vocabulary.
  double expert_elems = 0,
         dense_elems = x.v * x.d * (cfg.tie_embeddings() ? 1 : 2) + x.norm_vecs * x.d;
  std::vector<double> block_grads;
  // ZeRO-3: a block's bytes while whole and while its gather is in flight (below).
  std::vector<double> block_whole, block_in_flight;
  const bool copy_part = opt.weight_copies && opt.layout.zero_stage >= 3;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    const double e = block_param_elems(cfg, x, routed[b], moe[b]);
    // Under bf16 weight copies the copy part travels at 2 bytes into the copies (counted with
    // the block's activations, as ever), its masters never whole; the rest as f32 masters.
    const double masters = copy_part ? block_master_read_elems(cfg, x, routed[b], moe[b]) : e;
    block_whole.push_back(kMaster * masters);
    block_in_flight.push_back(kMaster * masters + x.a * (e - masters));
    const double experts = moe[b] ? x.experts_local * mlp_mats(x) * x.fe * x.d : 0;
    expert_elems += experts;
    dense_elems += e - experts;
    block_grads.push_back(e * kMaster);
  }
  const double param_elems = dense_elems + expert_elems;
  plan.embedding_parameters = kMaster * x.v * x.d;
  plan.head_parameters = kMaster * (x.norm_vecs * x.d + (cfg.tie_embeddings() ? 0 : x.v * x.d));
  plan.parameters = param_elems * kMaster;
  plan.gradients = plan.parameters;
  // ZeRO-3 (parallel/zero3.h, zero3_parameters): the rank's slices, the outer unit (embedding,
  // final norm, head) whole, a block whole and the next in flight; its gradient buckets are the
  // units, so the largest unit bounds a bucket.
  const bool stage3 = opt.layout.zero_stage >= 3;
  const double outer_elems = dense_elems + expert_elems -
                             std::accumulate(block_grads.begin(), block_grads.end(), 0.0) / kMaster;
  const double largest_block = *std::max_element(block_grads.begin(), block_grads.end());
  const int dp = opt.layout.dp;
  // One block whole and the next one's gather in flight: its receive buffer and 1/dp of it
  // sent. Under bf16 weight copies the outer unit's copy part (final norm, an untied head) is
  // whole only as copies (the head's counted with the head's activations).
  double units = zero3_f32_units(opt.layout, largest_block);
  if (copy_part) {
    units = 0;
    for (size_t b = 0; b < block_whole.size(); ++b)
      units = std::max(units, block_whole[b] + (1 + 1.0 / dp) * block_in_flight[b]);
  }
  const double outer_copies =
      copy_part ? x.norm_vecs * x.d + (cfg.tie_embeddings() ? 0 : x.v * x.d) : 0;
  if (stage3)
    plan.parameters = zero3_parameters(opt.layout, kMaster * dense_elems, kMaster * expert_elems,
                                       kMaster * (outer_elems - outer_copies), units);
  const ReducedState reduced =
      reduced_state(opt.layout, kMaster * dense_elems, kMaster * expert_elems);
  plan.optimizer = reduced.optimizer;
  const double buckets = reduced.buckets;
  // ZeRO-2 on the last micro-batch: the full gradients of the bucket filling and the packed
  // buffer of the one in flight, never more than backward has made (data_parallel.h). With
  // gradient accumulation every full gradient is kept until then.
  const bool releases_all = reduced.releases && opt.grad_accum == 1;
  const double bucket_bytes =
      stage3 ? std::max(largest_block, outer_elems * kMaster) : opt.layout.bucket_mb * 1024 * 1024;
  auto live_grads = [&](double made) {
    return releases_all ? std::min(made, 2 * bucket_bytes) : made;
  };
  if (releases_all) plan.gradients = reduced.owned;
  const double base = plan.parameters + plan.optimizer + buckets;

  // Forward: what every block keeps until its backward.
  double kept_total = 0, causal_total = 0;
  std::vector<double> causal_kept;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    BlockMemory bm;
    bm.block = b;
    bm.routed = routed[b];
    bm.moe = moe[b];
    bm.recomputed = recomputed[b];
    bm.tokens = capacities[b];
    bm.parameters = block_grads[b];
    bm.expert_parameters = moe[b] ? kMaster * x.experts_local * mlp_mats(x) * x.fe * x.d : 0;
    const double nb = bs * static_cast<double>(bm.tokens);
    const double slots = moe[b] ? bs * cfg.moe().n_experts() *
                                      static_cast<double>(expert_slots(cfg.moe(), bm.tokens)) / x.tp
                                : 0;
    // Under sequence parallelism a dense block's residual region holds its share of the
    // positions; a routed block runs on its gathered rows, whole on every rank.
    const double share = routed[b] ? 1.0 : x.seq_share;
    const double delta = delta_kept(cfg, x, nb, bm.tokens, moe[b], bs, share);
    const double copies = block_weight_copies(x, moe[b]);
    bm.backward_temp = delta_backward_temp(x, nb, moe[b], slots);
    // A recomputed block is one recompute region (model/block.cpp): dense, x + f(x) from x;
    // routed, g(r) * f on the gathered rows from those rows, their positions and g. Its
    // backward makes again what NONE would have kept, less what the region kept.
    double region_kept = nb * x.d * x.a * share, reused = region_kept;
    if (bm.recomputed && opt.recompute == modtrain::TrainConfig::SELECTIVE) {
      region_kept = delta_selective_kept(cfg, x, nb, bm.tokens, moe[b], bs);
      reused = selective_shared(x, nb, moe[b]);
    }
    const double block_kept = bm.recomputed ? region_kept : delta + copies;
    if (bm.recomputed) bm.backward_temp += delta - reused + copies;
    if (!routed[b]) {
      // The residual add saves nothing; the block's input is norm1's saved x.
      bm.kept = block_kept;
    } else {
      // The router keeps the block input, as an f32 copy under bf16 (routing scores run in
      // master precision) unless row_scores reads it as it is (train.fusions.router_scores).
      // The predictor's hidden layer runs in the compute dtype on that same input (no copy of
      // its own) and keeps its pre-activation for SiLU and its output for the logit layer, the
      // latter as an f32 copy when the router's is; g(r) [C,1]; r, the top-C indices and the
      // causal losses' inputs. Without recomputation the gate multiply (or scatter_gated_rows)
      // also keeps f [C,D]. The predictor's part hangs off the loss alone (its input is
      // detached), so the backward runs it first and it is gone before the LM head's.
      // Under sequence parallelism the router and predictor read the rank's positions only.
      const bool router_copy = x.bf16 && !opt.fused_router_scores;
      const double ns = n * x.seq_share;
      const double predictor_kept =
          predictor ? ns * causal.predictor_hidden() * (x.a + (router_copy ? kMaster : x.a)) : 0;
      double around = (router_copy ? ns * x.d * kMaster : ns * x.d * x.a) + predictor_kept;
      around += nb * x.a + n * kStats * 4 + nb * 16;
      if (!bm.recomputed) around += nb * x.d * x.a;
      bm.kept = around + block_kept;
      causal_kept.push_back(predictor_kept);
      causal_total += predictor_kept;
    }
    if (!routed[b]) causal_kept.push_back(0);
    plan.weight_copies += bm.recomputed ? 0 : copies;
    kept_total += bm.kept;
    plan.blocks.push_back(bm);
  }

  // Head: the final norm keeps its input and output (the LM head matmul's input); logits in the
  // compute dtype (ForwardResult holds them) and, under bf16, the f32 copy cross-entropy saves;
  // the head weight's compute copy (bf16); targets and lse.
  const double head_copy = x.bf16 ? x.v * x.d * x.a : 0;
  plan.weight_copies += head_copy;
  // Under sequence parallelism the final norm's input and statistics are the rank's share;
  // its output is gathered whole for the head.
  plan.head_kept = n * x.d * x.a * (1 + x.seq_share) + n * kStats * x.norm_stats * x.seq_share +
                   n * x.v * x.a +
                   (x.bf16 ? n * x.v * kMaster : 0) + n * (8 + kStats) + head_copy;
  // Head backward, in the engine's order: cross-entropy makes dlogits in f32; under bf16 its
  // node then lets go of the f32 logits it saved (as large as dlogits) before the cast's
  // backward makes the bf16 dlogits and frees the f32 ones; then the matmul's input gradient
  // and the vocabulary-sized weight gradient (and its f32 cast).
  const double dlogits32 = n * x.v * kMaster, dlogits16 = x.bf16 ? n * x.v * x.a : 0;
  const double matmul = n * x.d * x.a + x.v * x.d * (x.a + (x.bf16 ? kMaster : 0));
  plan.head_backward_temp =
      x.bf16 ? std::max({dlogits32, dlogits16, dlogits16 + matmul - dlogits32})
             : dlogits32 + matmul;
  if (opt.fused_classifier) {
    // linear_cross_entropy keeps dx [n,D] and dW [V,D] (f32 under bf16) and not the logits, the
    // norm's output or the weight's bf16 copy; while it runs it holds one chunk of logits, the
    // losses [n], and those copies. Its backward only scales dx and dW (under bf16 rounding
    // them to bf16 copies, and the weight's cast makes its f32 gradient).
    const double acc = x.bf16 ? kMaster : x.a;
    const double chunk =
        std::min(n, static_cast<double>(linear_cross_entropy_chunk_rows(
                        static_cast<int64_t>(x.v), x.bf16 ? DType::BF16 : DType::F32))) * x.v * x.a;
    plan.weight_copies -= head_copy;
    plan.head_kept = n * x.d * x.a + n * kStats * x.norm_stats + (n + x.v) * x.d * acc;
    plan.head_forward_temp = chunk + n * acc + n * x.d * x.a + head_copy;
    plan.head_backward_temp = x.bf16 ? (n + x.v) * x.d * x.a + x.v * x.d * kMaster : 0;
  }
  plan.activations = kept_total + plan.head_kept;

  // Backward, in reverse: head, blocks L-1..0, embedding. Live = base + gradients so far +
  // what is still kept + the running step's temporaries; the incoming gradient [n,D] flows
  // between blocks.
  double peak = base + plan.activations, grads = 0, kept = plan.activations;
  plan.peak_at = "end of forward";
  auto visit = [&](double live, const std::string& where) {
    if (live > peak) {
      peak = live;
      plan.peak_at = where;
    }
  };
  visit(base + plan.activations + plan.head_forward_temp, "forward of the fused LM head and loss");
  kept -= causal_total;  // the causal-routing losses' backward, first
  visit(base + kept + plan.head_backward_temp, "backward of the LM head and loss");
  kept -= plan.head_kept;
  grads += x.norm_vecs * x.d * kMaster + x.v * x.d * kMaster;  // final norm; the head weight
  const double gx = n * x.d * x.a * x.seq_share;  // the stream's gradient, as split as the stream
  plan.largest_temporary = plan.head_backward_temp;
  for (int b = cfg.n_layers() - 1; b >= 0; --b) {
    const BlockMemory& bm = plan.blocks[b];
    const std::string where = "backward of block " + std::to_string(b);
    visit(base + live_grads(grads) + kept + gx + bm.backward_temp, where);
    kept -= bm.kept - causal_kept[b];
    grads += block_grads[b];
    visit(base + live_grads(grads) + kept + gx, where);
    plan.largest_temporary = std::max(plan.largest_temporary, bm.backward_temp);
  }
  // Embedding backward: the table's gradient in full, then added to the tied head's.
  const double embed_grad = x.v * x.d * kMaster;
  plan.stream_grad = gx;
  plan.embedding_backward_temp = gx * (kMaster / x.a) + embed_grad;
  visit(base + live_grads(grads) + kept + plan.embedding_backward_temp, "backward of the embedding");
  if (!cfg.tie_embeddings()) grads += embed_grad;
  if (releases_all) grads = 0;  // finish(): every bucket reduced, its buffer gone
  // Clipping reads each gradient in place (its factor is applied inside the update); ZeRO-1's
  // update gathers every slice.
  if (opt.layout.zero_stage >= 1 && !stage3)
    visit(base + grads + kept + kMaster * (param_elems + param_elems / dp), "ZeRO all-gather");
  plan.peak = peak;

  if (x.seq_share < 1 && opt.recompute == modtrain::TrainConfig::SELECTIVE)
    plan.notes.push_back(
        "SELECTIVE recompute under sequence parallelism: its kept GEMM outputs are counted whole");
  if (cfg.moe().enabled() && (opt.layout.ep > 1 || opt.layout.tp > 1))
    plan.notes.push_back("MoE under ep or tp > 1: the expert exchange's buffers are not counted");
  return plan;
}

std::string format_bytes(double bytes) {
  char s[32];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(s, sizeof s, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(s, sizeof s, "%.1f MiB", bytes / (1024.0 * 1024));
  return s;
}

std::string describe_memory(const MemoryPlan& p, const MemoryOptions& opt) {
  static const char* kRecompute[] = {"NONE", "SELECTIVE", "FULL"};
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line,
                "per rank: tp %d%s, dp %d, ep %d, zero_stage %d, %lld sequences per micro-batch, "
                "%s, recompute %s\n",
                opt.layout.tp, opt.layout.sequence_parallel ? " (sequence parallel)" : "",
                opt.layout.dp, opt.layout.ep, opt.layout.zero_stage,
                static_cast<long long>(opt.batch_per_rank), opt.bf16 ? "bf16 compute" : "f32",
                kRecompute[static_cast<int>(opt.recompute)]);
  os << line;
  auto row = [&](const char* what, double bytes) {
    std::snprintf(line, sizeof line, "  %-34s %12s\n", what, format_bytes(bytes).c_str());
    os << line;
  };
  row(opt.layout.zero_stage >= 3 ? "parameters (ZeRO-3: /dp + units)"
                                  : "parameters (f32 masters)",
      p.parameters);
  row(opt.layout.zero_stage >= 2 ? "gradients (f32; ZeRO-2: owned /dp)" : "gradients (f32)",
      p.gradients);
  row(opt.layout.zero_stage >= 1 ? "optimizer (AdamW m, v; ZeRO /dp)" : "optimizer (AdamW m, v)",
      p.optimizer);
  os << "  activations kept for backward:\n";
  os << "    block  kind    tokens/seq  recompute        kept   backward temp\n";
  for (const BlockMemory& b : p.blocks) {
    std::snprintf(line, sizeof line, "    %5d  %-6s  %10lld  %9s  %10s  %14s\n", b.block,
                  b.routed ? (b.moe ? "r+moe" : "routed") : (b.moe ? "moe" : "dense"),
                  static_cast<long long>(b.tokens), b.recomputed ? "yes" : "no",
                  format_bytes(b.kept).c_str(), format_bytes(b.backward_temp).c_str());
    os << line;
  }
  row("  LM head and loss", p.head_kept);
  if (p.weight_copies > 0) row("  (bf16 weight copies, included)", p.weight_copies);
  row("  total at the end of forward", p.activations);
  row("largest temporary", p.largest_temporary);
  row("predicted peak", p.peak);
  os << "  peak at: " << p.peak_at << "\n";
  for (const std::string& n : p.notes) os << "  note: " << n << "\n";
  return os.str();
}

}  // namespace mod::model
