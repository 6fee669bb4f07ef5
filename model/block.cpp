// The pre-norm block and top-C routing (see block.h).
#include "model/block.h"

#include "core/all_ops.h"

namespace mod::model {

namespace {
// pos [B,T], idx [B,C] -> [B,C]: the original positions of the routed tokens (on the device).
Tensor gather_positions(const Tensor& pos, const Tensor& idx) {
  const int64_t b = idx.size(0), c = idx.size(1), t = pos.size(1);
  Tensor out = Tensor::empty({b, c, 1}, DType::I64, idx.device());
  backend_of(out).gather_rows(pos.view({b, t, 1}), idx, out);
  return out.view({b, c});
}

}  // namespace

void ForwardResult::add_aux_loss(const Tensor& term) {
  aux_loss = aux_loss.defined() ? add(aux_loss, term) : term;
}

Tensor apply_gate(modtrain::RouterConfig::Gate gate, const Tensor& r) {
  return autocast(gate == modtrain::RouterConfig::SIGMOID ? sigmoid(r) : r);
}

Block::Block(const modtrain::ModelConfig& cfg, bool routed, Rng& rng, DType dtype, bool moe) {
  const int64_t d = cfg.d_model();
  norm1_ = register_module("norm1", std::make_shared<nn::RMSNorm>(d, cfg.norm_eps(), dtype));
  attn_ = register_module("attn", std::make_shared<Attention>(cfg, rng, dtype));
  norm2_ = register_module("norm2", std::make_shared<nn::RMSNorm>(d, cfg.norm_eps(), dtype));
  if (moe)
    moe_ = register_module("mlp", std::make_shared<MoeMlp>(cfg, rng, dtype));
  else
    mlp_ = register_module("mlp", std::make_shared<Mlp>(cfg, rng, dtype));
  if (!routed) return;
  const auto& mod = cfg.mod();
  router_ = register_module(
      "router", std::make_shared<Router>(d, mod.router().bias(), rng, cfg.init_std(), dtype));
  if (mod.causal().method() == modtrain::CausalRoutingConfig::PREDICTOR)
    predictor_ =
        register_module("predictor", std::make_shared<Predictor>(d, mod.causal().predictor_hidden(),
                                                                 rng, cfg.init_std(), dtype));
}

Tensor Block::delta(const Tensor& x, const Tensor& pos, KvCache* cache, RoutingMode mode,
                    ForwardResult* result) const {
  Tensor a = attn_->forward(norm1_->forward(x), pos, cache);
  Tensor h = norm2_->forward(add(x, a));
  if (!moe_) return add(a, mlp_->forward(h));
  if (mode == RoutingMode::Causal) return add(a, moe_->forward_causal(h));
  MoeOutput m = moe_->forward(h);
  if (result) {
    if (m.aux.defined()) result->add_aux_loss(m.aux);
    result->moe_stats.push_back(m.stats);
  }
  return add(a, m.out);
}

TopCRouting route_top_c(const Block& blk, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result) {
  const int64_t batch = x.size(0), t = x.size(1);
  TopCRouting out;
  out.r = blk.router()->scores(x);       // [B,T]
  out.idx = topk_rows(out.r, capacity);  // [B,C] ascending, ties to lower
  Tensor f = blk.delta(gather_rows(x, out.idx), gather_positions(pos, out.idx), nullptr,
                       RoutingMode::TopC, result);                                   // [B,C,D]
  Tensor g = apply_gate(gate, gather_rows(reshape(out.r, {batch, t, 1}), out.idx));  // [B,C,1]
  out.out = scatter_add_rows(x, out.idx, mul(f, g));
  return out;
}

}  // namespace mod::model
