// The pre-norm block, the routed update and top-C routing (see block.h).
#include "model/block.h"

#include <functional>
#include <memory>

#include "core/all_ops.h"
#include "core/recompute.h"

namespace mod::model {

namespace {
// pos [B,T], idx [B,C] -> [B,C]: the original positions of the routed tokens (on the device).
Tensor gather_positions(const Tensor& pos, const Tensor& idx) {
  const int64_t b = idx.size(0), c = idx.size(1), t = pos.size(1);
  Tensor out = Tensor::empty({b, c, 1}, DType::I64, idx.device());
  backend_of(out).gather_rows(pos.view({b, t, 1}), idx, out);
  return out.view({b, c});
}

// body(inputs, local) -> a block's output (and the next norm of it, when fused), its MoE
// auxiliary loss and statistics going into local. Under recomputation it runs as a recompute
// region whose outputs are that output, its norm and the auxiliary loss (so the loss still
// reaches the MoE router); the statistics of the forward are added to *result once, never those
// of the recomputation.
using RegionBody =
    std::function<Residual(const std::vector<Tensor>& inputs, ForwardResult& local)>;
Residual run_region(Recompute recompute, RegionBody body, const std::vector<Tensor>& inputs,
                    ForwardResult* result) {
  if (recompute == modtrain::TrainConfig::NONE) {
    ForwardResult discard;
    return body(inputs, result ? *result : discard);
  }
  auto stats = std::make_shared<std::vector<MoeStats>>();
  RegionFn fn = [body = std::move(body), stats](const std::vector<Tensor>& in) {
    ForwardResult local;
    Residual out = body(in, local);
    *stats = std::move(local.moe_stats);
    return std::vector<Tensor>{out.x, out.normed, local.aux_loss};
  };
  const std::vector<Tensor> out =
      recompute_region(fn, inputs,
                       recompute == modtrain::TrainConfig::FULL ? RegionKeeps::InputsOnly
                                                                : RegionKeeps::CostlyOpOutputs);
  if (result) {
    if (out[2].defined()) result->add_aux_loss(out[2]);
    for (MoeStats& s : *stats) result->moe_stats.push_back(std::move(s));
  }
  stats->clear();
  return {out[0], out[1]};
}

}  // namespace

Tensor apply_gate(modtrain::RouterConfig::Gate gate, const Tensor& r) {
  return autocast(gate == modtrain::RouterConfig::SIGMOID ? sigmoid(r) : r);
}

Block::Block(const modtrain::ModelConfig& cfg, bool routed, Rng& rng, DType dtype, bool moe,
             Fusions fusions)
    : fusions_(fusions) {
  const int64_t d = cfg.d_model();
  norm1_ = register_module("norm1", make_norm(cfg, dtype));
  attn_ = register_module("attn", std::make_shared<Attention>(cfg, rng, dtype));
  norm2_ = register_module("norm2", make_norm(cfg, dtype));
  if (moe)
    moe_ = register_module("mlp", std::make_shared<MoeMlp>(cfg, rng, dtype));
  else
    mlp_ = register_module("mlp", std::make_shared<Mlp>(cfg, rng, dtype, fusions.gelu_mlp));
  if (!routed) return;
  const auto& mod = cfg.mod();
  router_ = register_module(
      "router", std::make_shared<Router>(d, mod.router().bias(), rng, cfg.init_std(), dtype,
                                         fusions.router_scores));
  if (mod.causal().method() == modtrain::CausalRoutingConfig::PREDICTOR)
    predictor_ =
        register_module("predictor", std::make_shared<Predictor>(d, mod.causal().predictor_hidden(),
                                                                 rng, cfg.init_std(), dtype,
                                                                 fusions.router_scores));
}

// The MLP's (or MoE's) output for the normed h.
Tensor Block::mlp(const Tensor& h, RoutingMode mode, ForwardResult* result) const {
  if (!moe_) return mlp_->forward(h);
  if (mode == RoutingMode::Causal) return moe_->forward_causal(h);
  MoeOutput m = moe_->forward(h);
  if (result) {
    if (m.aux.defined()) result->add_aux_loss(m.aux);
    result->moe_stats.push_back(m.stats);
  }
  return m.out;
}

AddNorm Block::add_norm2(const Tensor& x, const Tensor& a) const {
  if (fusions_.add_norm) return norm2_->add_forward(x, a);
  Tensor s = add(x, a);
  Tensor h = norm2_->forward(s);
  return {s, h};
}

Tensor Block::delta(const Tensor& x, const Tensor& pos, KvCache* cache, RoutingMode mode,
                    ForwardResult* result) const {
  Tensor a = attn_->forward(norm1_->forward(x), pos, cache);
  return add(a, mlp(add_norm2(x, a).normed, mode, result));
}

Tensor Block::update(const Tensor& x, const Tensor& pos, KvCache* cache, RoutingMode mode,
                     ForwardResult* result) const {
  return update(Residual{x, Tensor()}, pos, cache, mode, result, nullptr).x;
}

Residual Block::update(const Residual& in, const Tensor& pos, KvCache* cache, RoutingMode mode,
                       ForwardResult* result, const nn::Norm* next) const {
  const Tensor h1 = in.normed.defined() ? in.normed : norm1_->forward(in.x);
  const AddNorm s = add_norm2(in.x, attn_->forward(h1, pos, cache));
  const Tensor m = mlp(s.normed, mode, result);
  if (!next) return {add(s.sum, m), Tensor()};
  const AddNorm out = next->add_forward(s.sum, m);
  return {out.sum, out.normed};
}

Tensor routed_update(const Block& blk, const Tensor& x, const Tensor& pos, const Tensor& r,
                     const Tensor& idx, modtrain::RouterConfig::Gate gate, RoutingMode mode,
                     KvCache* cache, ForwardResult* result, Recompute recompute,
                     const SequenceSplit* split) {
  const int64_t batch = x.size(0), t = r.size(1);
  const Tensor xs = split ? split->gather_rows(x, idx) : gather_rows(x, idx);  // [B,C,D]
  const Tensor xs_pos = gather_positions(pos, idx);                            // [B,C]
  Tensor g = apply_gate(gate, gather_rows(reshape(r, {batch, t, 1}), idx));    // [B,C,1]
  if (!split && blk.fusions().routed_scatter && recompute == modtrain::TrainConfig::NONE)
    return scatter_gated_rows(x, idx, blk.delta(xs, xs_pos, cache, mode, result), g);
  // in: the gathered rows, their positions, their router weights -> g * f [B,C,D]
  RegionBody scaled_delta = [&blk, cache, mode](const std::vector<Tensor>& in,
                                                ForwardResult& local) {
    return Residual{mul(blk.delta(in[0], in[1], cache, mode, &local), in[2]), Tensor()};
  };
  const Tensor y = run_region(recompute, scaled_delta, {xs, xs_pos, g}, result).x;
  return split ? split->scatter_add_rows(x, idx, y) : scatter_add_rows(x, idx, y);
}

TopCRouting route_top_c(const Block& blk, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result,
                        Recompute recompute, const SequenceSplit* split) {
  TopCRouting out;
  out.r_own = blk.router()->scores(x);                                   // [B,T/n]
  out.r = split ? split->gather_scalars(out.r_own) : out.r_own;          // [B,T]
  out.idx = topk_rows(out.r, capacity);  // [B,C] ascending, ties to lower
  out.out = routed_update(blk, x, pos, out.r, out.idx, gate, RoutingMode::TopC, nullptr, result,
                          recompute, split);
  return out;
}

Residual dense_update(const Block& blk, const Residual& in, const Tensor& pos, RoutingMode mode,
                      ForwardResult* result, Recompute recompute, const nn::Norm* next) {
  RegionBody update = [&blk, pos, mode, next](const std::vector<Tensor>& in,
                                              ForwardResult& local) {
    return blk.update(Residual{in[0], in.size() > 1 ? in[1] : Tensor()}, pos, nullptr, mode,
                      &local, next);
  };
  if (!in.normed.defined()) return run_region(recompute, update, {in.x}, result);
  return run_region(recompute, update, {in.x, in.normed}, result);
}

}  // namespace mod::model
