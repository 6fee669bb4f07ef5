// One pre-norm transformer block and MoD's top-C routing around it.
// Shape legend: B batch, T tokens, D width, C routed capacity.
//
// MoD invariants kept here (docs/architecture.md section 3):
// - top-C per sequence, never across the batch; indices ascending, ties to the lower position;
// - routed tokens keep their original positions for RoPE and the causal mask;
// - routed tokens get x + g(r) * f(X~) where f is the block's residual delta (attention + MLP,
//   without the residual itself, so the residual is added once); other tokens pass unchanged;
// - the router learns only through g(r) * f, so r stays on the gradient path.
#pragma once

#include <memory>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/nn/module.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/routing_stats.h"

namespace mod::model {

// TopC: training-time routing (top-C of each sequence). Causal: a token enters a routed block
// iff the predictor (or, without one, the router) gives a logit > 0; sequences are run one by one
// because their routed counts differ.
enum class RoutingMode { TopC, Causal };

struct ForwardResult {
  Tensor logits;    // [B,T,V] ([B,T,V/tp], this rank's vocabulary slice, under tensor parallelism)
  Tensor lm_loss;   // scalar; undefined without targets
  Tensor aux_loss;  // scalar: predictor BCE + weighted router BCE + MoE losses; undefined if none
  Tensor loss;      // lm_loss (+ aux_loss): what backward runs on
  std::vector<RoutedBlockStats> stats;
  std::vector<MoeStats> moe_stats;  // per MoE layer run, in block order
  std::vector<Tensor> routed_idx;   // top-C mode: [B,C] i64 per routed block, in block order

  void add_aux_loss(const Tensor& term);  // aux_loss += term (aux_loss may be undefined)
};

// One pre-norm block. delta() is f: the block's contribution before the residual add. A
// routed block also owns its router and (for causal method PREDICTOR) its predictor; an MoE
// block has a MoeMlp where others have an Mlp (both named "mlp").
class Block : public nn::Module {
 public:
  Block(const modtrain::ModelConfig& cfg, bool routed, Rng& rng, DType dtype = DType::F32,
        bool moe = false);
  // f(x) = a + mlp(norm2(x + a)), a = attn(norm1(x)); x [B,T,D], pos [B,T]. An MoE MLP routes
  // by mode and adds its auxiliary loss and statistics to *result (dropped when null).
  Tensor delta(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr,
               RoutingMode mode = RoutingMode::TopC, ForwardResult* result = nullptr) const;
  // x + f(x) for a block every token passes, as s + mlp(norm2(s)) with s = x + a: two residual
  // adds where x + delta(x) takes three, and one gradient sum fewer in the backward.
  Tensor update(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr,
                RoutingMode mode = RoutingMode::TopC, ForwardResult* result = nullptr) const;
  const Router* router() const { return router_.get(); }           // null when dense
  const Predictor* predictor() const { return predictor_.get(); }  // null unless PREDICTOR
  MoeMlp* moe() const { return moe_.get(); }                       // null with a dense MLP

 private:
  Tensor mlp(const Tensor& h, RoutingMode mode, ForwardResult* result) const;

  std::shared_ptr<nn::Norm> norm1_, norm2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
  std::shared_ptr<MoeMlp> moe_;
  std::shared_ptr<Router> router_;
  std::shared_ptr<Predictor> predictor_;
};

// One routed block in training mode, steps in order: router r = w.x; per-sequence top-C of r
// (ascending, ties to the lower position); gather the routed rows; the block's delta f on the
// gathered sub-sequence at its original positions; scale by g(r); scatter-add into x.
struct TopCRouting {
  Tensor out;  // [B,T,D]
  Tensor r;    // [B,T] router logits (on the gradient path)
  Tensor idx;  // [B,C] i64
};
// Under train.recompute the region kept for backward is g(r) * f on the gathered rows: router,
// top-C, gathers and scatter stay outside it, so the routing is never recomputed.
using Recompute = modtrain::TrainConfig::Recompute;
TopCRouting route_top_c(const Block& block, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result = nullptr,
                        Recompute recompute = modtrain::TrainConfig::NONE);

// A dense block's update x + f(x) [B,T,D]; under train.recompute one recompute region.
Tensor dense_update(const Block& block, const Tensor& x, const Tensor& pos, RoutingMode mode,
                    ForwardResult* result, Recompute recompute = modtrain::TrainConfig::NONE);

// g(r): the router weight that scales a routed token's delta (identity, the paper; or sigmoid),
// in the compute dtype of the delta it scales (r itself is kept in master precision).
Tensor apply_gate(modtrain::RouterConfig::Gate gate, const Tensor& r);

}  // namespace mod::model
