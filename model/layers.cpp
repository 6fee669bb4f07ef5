// The block's layers (see layers.h).
#include "model/layers.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"

namespace mod::model {

std::shared_ptr<nn::Norm> make_norm(const modtrain::ModelConfig& cfg, DType dtype) {
  if (cfg.norm() == modtrain::ModelConfig::LAYER)
    return std::make_shared<nn::LayerNorm>(cfg.d_model(), cfg.norm_eps(), dtype);
  return std::make_shared<nn::RMSNorm>(cfg.d_model(), cfg.norm_eps(), dtype);
}

Attention::Attention(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype)
    : head_dim_(cfg.d_model() / cfg.n_heads()), rope_theta_(cfg.rope_theta()) {
  const int64_t d = cfg.d_model();
  const double std = cfg.init_std(), out_std = std / std::sqrt(2.0 * cfg.n_layers());
  wq_ = register_module("wq", std::make_shared<nn::Linear>(d, d, false, rng, std, dtype));
  wk_ = register_module("wk", std::make_shared<nn::Linear>(d, d, false, rng, std, dtype));
  wv_ = register_module("wv", std::make_shared<nn::Linear>(d, d, false, rng, std, dtype));
  wo_ = register_module("wo", std::make_shared<nn::Linear>(d, d, false, rng, out_std, dtype));
}

Tensor Attention::forward(const Tensor& x, const Tensor& pos, KvCache* cache) const {
  // The projections' length, not x's: under sequence parallelism x holds T/tp positions and
  // the input hook gathers all T.
  const Tensor q_proj = wq_->forward(x);
  const int64_t b = q_proj.size(0), t = q_proj.size(1);
  const int64_t local_heads = wq_->weight().size(0) / head_dim_;  // H / tp under tensor parallelism
  const Shape heads{b, t, local_heads, head_dim_};
  Tensor q = rope(reshape(q_proj, heads), pos, rope_theta_);
  Tensor k = rope(reshape(wk_->forward(x), heads), pos, rope_theta_);
  Tensor v = reshape(wv_->forward(x), heads);
  Tensor a;
  if (!cache) {
    a = attention(q, k, v, pos);
  } else if (cache->len.defined()) {
    // One token per sequence: [B,1] tokens, or [1,N] gathered ones named by cache->rows.
    const Shape one{b * t, 1, local_heads, head_dim_};
    kv_cache_append(k.view(one), v.view(one), cache->admit, cache->len, cache->k, cache->v,
                    cache->rows);
    a = decode_attention(q.view(one), cache->k, cache->v, cache->len, cache->rows).view(heads);
  } else {
    if (b != 1 || grad_enabled())
      throw std::logic_error("attention with a KV cache: batch 1 under NoGradGuard only");
    const int64_t n = cache->size();
    if (n + t > cache->k.size(0))
      throw std::out_of_range("KV cache full: " + std::to_string(n + t) + " tokens, room for " +
                              std::to_string(cache->k.size(0)));
    cache->k.narrow0(n, t).copy_from(k);
    cache->v.narrow0(n, t).copy_from(v);
    const Tensor host_pos = pos.to(Device::CPU);
    for (int64_t i = 0; i < t; ++i) cache->pos.push_back(static_cast<int64_t>(host_pos.at(i)));
    const Shape kv{1, n + t, local_heads, head_dim_};
    a = attention(q, cache->k.narrow0(0, n + t).view(kv), cache->v.narrow0(0, n + t).view(kv), pos,
                  Tensor::from_indices(cache->pos, {1, n + t}).to(pos.device()));
  }
  return wo_->forward(reshape(a, {b, t, local_heads * head_dim_}));
}

Mlp::Mlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype, bool fuse_gelu)
    : swiglu_(cfg.mlp() == modtrain::ModelConfig::SWIGLU), fuse_gelu_(fuse_gelu && !swiglu_) {
  const int64_t d = cfg.d_model(), ff = cfg.d_ff();
  const double std = cfg.init_std(), out_std = std / std::sqrt(2.0 * cfg.n_layers());
  up_ = register_module("up", std::make_shared<nn::Linear>(d, ff, false, rng, std, dtype));
  if (swiglu_)
    gate_ = register_module("gate", std::make_shared<nn::Linear>(d, ff, false, rng, std, dtype));
  down_ = register_module("down", std::make_shared<nn::Linear>(ff, d, false, rng, out_std, dtype));
}

Tensor Mlp::forward(const Tensor& x) const {
  if (fuse_gelu_)
    return down_->output(gelu_mlp(autocast(up_->input(x)), autocast(up_->weight()),
                                  autocast(down_->weight())));
  Tensor h = swiglu_ ? swiglu(gate_->forward(x), up_->forward(x)) : gelu(up_->forward(x));
  return down_->forward(h);
}

Tensor master_precision_scores(const nn::Linear& layer, const Tensor& x, bool fused) {
  return in_master_precision(layer, [&] {
    const Tensor& w = layer.weight();
    if (!fused || dtype_size(x.dtype()) >= dtype_size(w.dtype())) return layer.forward(x);
    const Tensor y = layer.output(row_scores(layer.input(x), w));  // w: the master, no cast
    return layer.bias().defined() ? bias_add(y, layer.bias()) : y;
  });
}

Router::Router(int64_t d_model, bool bias, Rng& rng, double init_std, DType dtype, bool fused)
    : fused_(fused) {
  proj_ =
      register_module("proj", std::make_shared<nn::Linear>(d_model, 1, bias, rng, init_std, dtype));
}

Tensor Router::scores(const Tensor& x) const {
  return reshape(master_precision_scores(*proj_, x, fused_), {x.size(0), x.size(1)});
}

Predictor::Predictor(int64_t d_model, int64_t hidden, Rng& rng, double init_std, DType dtype,
                     bool fused)
    : fused_(fused) {
  in_ = register_module("in",
                        std::make_shared<nn::Linear>(d_model, hidden, true, rng, init_std, dtype));
  out_ =
      register_module("out", std::make_shared<nn::Linear>(hidden, 1, true, rng, init_std, dtype));
}

// The hidden layer runs in the autocast dtype: its D x hidden product is nearly all of the
// predictor's work, and in f32 it had no tensor cores (3.6% of a GPT-2-small MoD step on an
// H100). Only the logit, which is thresholded, is summed in the master precision.
Tensor Predictor::logits(const Tensor& x) const {
  const Tensor h = silu(in_->forward(x));
  return reshape(master_precision_scores(*out_, h, fused_), {x.size(0), x.size(1)});
}

}  // namespace mod::model
