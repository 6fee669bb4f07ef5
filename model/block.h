// One pre-norm transformer block, MoD's routed update around it (the one place x + g(r) * f is
// computed) and top-C routing. Shape legend: B batch, T tokens, D width, C routed capacity.
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
#include "model/forward_result.h"
#include "model/fusions.h"
#include "model/layers.h"
#include "model/moe.h"
#include "model/sequence_split.h"

namespace mod::model {

// TopC: training-time routing (top-C of each sequence). Causal: a token enters a routed block
// iff the predictor (or, without one, the router) gives a logit > 0; sequences are run one by one
// because their routed counts differ.
enum class RoutingMode { TopC, Causal };

// The residual stream between blocks [B,T,D]. `normed`, when defined, is the next block's norm1
// of x, already made by the fused add + norm that produced x (train.fusions.add_norm).
struct Residual {
  Tensor x;
  Tensor normed;
};

// One pre-norm block. delta() is f: the block's contribution before the residual add. A
// routed block also owns its router and (for causal method PREDICTOR) its predictor; an MoE
// block has a MoeMlp where others have an Mlp (both named "mlp").
class Block : public nn::Module {
 public:
  Block(const modtrain::ModelConfig& cfg, bool routed, Rng& rng, DType dtype = DType::F32,
        bool moe = false, Fusions fusions = {});
  // f(x) = a + mlp(norm2(x + a)), a = attn(norm1(x)); x [B,T,D], pos [B,T]. An MoE MLP routes
  // by mode and adds its auxiliary loss and statistics to *result (dropped when null).
  Tensor delta(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr,
               RoutingMode mode = RoutingMode::TopC, ForwardResult* result = nullptr) const;
  // x + f(x) for a block every token passes, as s + mlp(norm2(s)) with s = x + a: two residual
  // adds where x + delta(x) takes three, and one gradient sum fewer in the backward.
  Tensor update(const Tensor& x, const Tensor& pos, KvCache* cache = nullptr,
                RoutingMode mode = RoutingMode::TopC, ForwardResult* result = nullptr) const;
  // The same from a stream whose norm1 may be made already (in.normed), and, given `next` (the
  // norm that follows this block: the next block's norm1, or the final norm), the last residual
  // add fused with it: returns {x + f(x), next(x + f(x))}.
  Residual update(const Residual& in, const Tensor& pos, KvCache* cache, RoutingMode mode,
                  ForwardResult* result, const nn::Norm* next) const;
  const nn::Norm& norm1() const { return *norm1_; }
  const Router* router() const { return router_.get(); }           // null when dense
  const Predictor* predictor() const { return predictor_.get(); }  // null unless PREDICTOR
  MoeMlp* moe() const { return moe_.get(); }                       // null with a dense MLP
  const Fusions& fusions() const { return fusions_; }

 private:
  Tensor mlp(const Tensor& h, RoutingMode mode, ForwardResult* result) const;
  // {x + a, norm2(x + a)}: one fused op under fusions_.add_norm, else add then norm2.
  AddNorm add_norm2(const Tensor& x, const Tensor& a) const;

  std::shared_ptr<nn::Norm> norm1_, norm2_;
  std::shared_ptr<Attention> attn_;
  std::shared_ptr<Mlp> mlp_;
  std::shared_ptr<MoeMlp> moe_;
  std::shared_ptr<Router> router_;
  std::shared_ptr<Predictor> predictor_;
  Fusions fusions_;
};

using Recompute = modtrain::TrainConfig::Recompute;

// The routed update x_i <- x_i + g(r_i) * f_i(X~) for the rows idx [B,C] (ascending) of x
// [B,T,D]; other rows pass unchanged. Steps: gather the rows, their positions pos [B,T] and
// router logits r [B,T]; the block's delta f on the gathered sub-sequence at its original
// positions; scale by g(r); scatter-add into x. Top-C training, causal evaluation and one-token
// decoding (idx [[0]], with the block's KV cache) differ only in how they choose idx. Under
// train.recompute the region kept for backward is g(r) * f on the gathered rows: the gathers and
// the scatter stay outside it, so the routing is never recomputed. A block not recomputed runs
// the gate multiply, scatter and residual add as one op under fusions().routed_scatter.
// With a split stream (split non-null) x is [B,T/n,D] while pos and r cover all T positions,
// and the split's gather_rows / scatter_add_rows move the rows.
Tensor routed_update(const Block& block, const Tensor& x, const Tensor& pos, const Tensor& r,
                     const Tensor& idx, modtrain::RouterConfig::Gate gate, RoutingMode mode,
                     KvCache* cache = nullptr, ForwardResult* result = nullptr,
                     Recompute recompute = modtrain::TrainConfig::NONE,
                     const SequenceSplit* split = nullptr);

// One routed block in training mode, steps in order: router r = w.x (on a split stream: on the
// local positions, then gathered); per-sequence top-C of r (ascending, ties to the lower
// position); then routed_update on those rows.
struct TopCRouting {
  Tensor out;    // [B,T,D] ([B,T/n,D] on a split stream)
  Tensor r;      // [B,T] router logits (on the gradient path)
  Tensor r_own;  // [B,T/n] the logits of the stream's own positions (r when not split)
  Tensor idx;    // [B,C] i64
};
TopCRouting route_top_c(const Block& block, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result = nullptr,
                        Recompute recompute = modtrain::TrainConfig::NONE,
                        const SequenceSplit* split = nullptr);

// A dense block's update x + f(x) [B,T,D] (Block::update: in.normed used when defined, and the
// last add fused with `next` when given); under train.recompute one recompute region, whose
// outputs are both of the returned tensors.
Residual dense_update(const Block& block, const Residual& in, const Tensor& pos, RoutingMode mode,
                      ForwardResult* result, Recompute recompute = modtrain::TrainConfig::NONE,
                      const nn::Norm* next = nullptr);

// g(r): the router weight that scales a routed token's delta (identity, the paper; or sigmoid),
// in the compute dtype of the delta it scales (r itself is kept in master precision).
Tensor apply_gate(modtrain::RouterConfig::Gate gate, const Tensor& r);

}  // namespace mod::model
