// The mixture-of-experts MLP: a linear router over E (+1 no-op) experts, per-sequence expert
// choice or token choice (moe_routing.h), and E expert MLPs stored as stacked weights.
//
// Shapes: B sequences, T tokens entering the MLP, D width, F expert width, E real experts,
// E' = E (+1 with the no-op expert), K slots per (sequence, expert), S = B * K.
//
//   router logits            [B,T,E']     probs = softmax over E'
//   slots (moe_select)       [E,B,K]      rows of x, expert-major, chosen on probs' device
//   dispatched x             [E,S,D]      gather_rows of the slots
//   (expert parallelism)     [E/ep, ep*S/tp, D] on the rank that owns the experts
//   expert MLPs              up/gate [E,F,D], down [E,D,F]: batched GEMMs
//   combined y * gate        [E,S,D] -> scatter-added into [B,T,D]
//
// A token's output is sum over the experts that took it of p_e(token) * expert_e(token); a
// token no real expert took (the no-op expert's, or one dropped under token choice) gets 0, so
// the block's residual passes it unchanged.
#pragma once

#include <functional>
#include <memory>

#include "configs/modtrain.pb.h"
#include "core/nn/module.h"
#include "model/moe_routing.h"

namespace mod::model {

// E expert MLPs as stacked weights: a layer is three batched GEMMs, and expert parallelism is a
// slice along dim 0 (local expert i is global expert first() + i).
class Experts : public nn::Module {
 public:
  Experts(int64_t n_experts, int64_t d_model, int64_t d_hidden, bool swiglu, double init_std,
          double out_std, Rng& rng, DType dtype);
  // x [E_local, S, D] -> [E_local, S, D]: local expert i on x[i].
  Tensor forward(const Tensor& x) const;
  // Local expert i on x [N, D] -> [N, D] (sampling and causal evaluation; no autograd).
  Tensor forward_one(int64_t i, const Tensor& x) const;
  int64_t local_count() const { return up_.size(0); }
  int64_t first() const { return first_; }
  // Keeps experts [first, first + count) (expert parallelism).
  void shard(int64_t first, int64_t count);

 private:
  bool swiglu_;
  int64_t first_ = 0;
  Tensor up_, gate_, down_;  // [E,F,D], [E,F,D] (SwiGLU only), [E,D,F]
};

// How dispatched slots reach the experts' ranks and come back (parallel/expert_parallel.h);
// unset, every expert is local.
struct ExpertExchange {
  std::function<Tensor(const Tensor&)> dispatch;  // [E,S,D] -> [E_local, S', D]
  std::function<Tensor(const Tensor&)> combine;   // [E_local, S', D] -> [E,S,D]
};

// Sequence parallelism (parallel/parallelize.h): a layer fed the split stream [B,T/n,D] gathers
// it whole before routing, runs as on a whole stream, and keeps its own positions of the output,
// so the routing, statistics and losses are those of all T positions. Unset, x is whole.
struct SequenceGather {
  std::function<Tensor(const Tensor&)> gather;  // [B,T/n,D] -> [B,T,D]
  std::function<Tensor(const Tensor&)> split;   // [B,T,D] -> [B,T/n,D]
};

// One MoE layer's statistics from one forward (no gradient).
struct MoeStats {
  int block = 0;
  double unrouted_fraction = 0, noop_fraction = 0, dropped_fraction = 0, max_load = 0;
  // Until resolve_moe_stats: the selection's per-sequence counts and shares, left on their
  // device so that the forward never waits for the host; top_k 0 once resolved.
  Tensor counts, share;
  Tensor slots;  // the selection's rows [E,B,K] i64 (routing logs in tests); dropped when resolved
  int64_t tokens = 0, top_k = 0;
  bool token_choice = false;
};
// Computes the fractions above from the tensors each entry holds (a host copy each), then drops
// them; entries already resolved are left alone.
void resolve_moe_stats(std::vector<MoeStats>& stats);

struct MoeOutput {
  Tensor out;  // [B,T,D]: the MLP's contribution (before the residual add)
  Tensor aux;  // scalar: weighted z-loss (+ balance loss under token choice); undefined if none
  MoeStats stats;
};

class MoeMlp : public nn::Module {
 public:
  MoeMlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype);
  // Training routing: per-sequence expert choice or token choice over x [B,T,D] ([B,T/n,D] with
  // a sequence gather set: routed over the gathered T).
  MoeOutput forward(const Tensor& x) const;
  // Causal routing (sampling, causal evaluation; no autograd): each token alone picks its
  // top_k experts (1 under expert choice) among E'; a no-op pick contributes nothing.
  Tensor forward_causal(const Tensor& x) const;

  const modtrain::MoEConfig& config() const { return cfg_; }
  Experts& experts() { return *experts_; }
  void set_exchange(ExpertExchange exchange) { exchange_ = std::move(exchange); }
  void set_sequence_gather(SequenceGather g) { sequence_ = std::move(g); }

 private:
  MoeOutput forward_whole(const Tensor& x) const;  // x [B,T,D], every position
  Tensor aux_losses(const Tensor& logits, const Tensor& probs, const MoeSelection& sel) const;

  modtrain::MoEConfig cfg_;
  int64_t n_all_;  // E'
  std::shared_ptr<nn::Linear> router_;
  std::shared_ptr<Experts> experts_;
  ExpertExchange exchange_;
  SequenceGather sequence_;
};

}  // namespace mod::model
