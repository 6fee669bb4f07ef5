// The MoD transformer: blocks, routing in training (top-C) and causal (per-token) modes, and
// one-token decoding through ragged per-block KV caches.
#include "model/transformer.h"

#include <cmath>
#include <stdexcept>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/routing_schedule.h"

namespace mod::model {

namespace {
using modtrain::CausalRoutingConfig;

// pos [B,T] i64 = 0..T-1 in every row, on the device.
Tensor make_positions(int64_t b, int64_t t, Device device) {
  Tensor pos = Tensor::empty({b, t}, DType::I64);
  for (int64_t i = 0; i < b * t; ++i) pos.data<int64_t>()[i] = i % t;
  return pos.to(device);
}

// [B,T]: 1 where the position is in idx [B,C], else 0. The top-C membership targets of the
// causal-routing losses, built per sequence on idx's device (a scatter of ones).
Tensor membership(const Tensor& idx, int64_t t, DType dtype) {
  const int64_t b = idx.size(0), c = idx.size(1);
  Tensor m = Tensor::zeros({b, t, 1}, dtype, idx.device());
  const Tensor ones = Tensor::full({b, c, 1}, 1.0, dtype, idx.device());
  backend_of(m).scatter_add_rows(idx, ones, m);
  return m.view({b, t});
}

// pos [B,T], idx [B,C] -> [B,C]: the original positions of the routed tokens (on the device).
Tensor gather_positions(const Tensor& pos, const Tensor& idx) {
  const int64_t b = idx.size(0), c = idx.size(1), t = pos.size(1);
  Tensor out = Tensor::empty({b, c, 1}, DType::I64, idx.device());
  backend_of(out).gather_rows(pos.view({b, t, 1}), idx, out);
  return out.view({b, c});
}

// Router statistics for metrics from the tensors the forward left in s (resolve_stats). On a
// GPU this copies three [B,T] tensors to the host.
void fill_stats(RoutedBlockStats& s) {
  const Tensor r = s.r.to(Device::CPU), decision_logits = s.decision.to(Device::CPU),
               member = s.member.to(Device::CPU);
  const int64_t n = r.numel(), t = r.size(-1);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    sum += r.at(i);
    sq += r.at(i) * r.at(i);
  }
  s.router_mean = sum / n;
  s.router_std = std::sqrt(std::max(0.0, sq / n - s.router_mean * s.router_mean));
  int64_t tp = 0, fp = 0, fn = 0, correct = 0;
  constexpr int kBuckets = 8;
  std::vector<double> routed(kBuckets, 0), total(kBuckets, 0);
  for (int64_t i = 0; i < n; ++i) {
    const bool said = decision_logits.at(i) > 0, is = member.at(i) > 0.5;
    tp += said && is;
    fp += said && !is;
    fn += !said && is;
    correct += said == is;
    const int bucket = static_cast<int>((i % t) * kBuckets / t);
    routed[bucket] += is;
    total[bucket] += 1;
  }
  s.accuracy = static_cast<double>(correct) / n;
  s.precision = tp + fp ? static_cast<double>(tp) / (tp + fp) : 0.0;
  s.recall = tp + fn ? static_cast<double>(tp) / (tp + fn) : 0.0;
  s.routed_fraction_by_bucket.resize(kBuckets);
  for (int k = 0; k < kBuckets; ++k) s.routed_fraction_by_bucket[k] = total[k] ? routed[k] / total[k] : 0;
}

Tensor add_defined(const Tensor& a, const Tensor& b) { return a.defined() ? add(a, b) : b; }

Tensor apply_gate(modtrain::RouterConfig::Gate gate, const Tensor& r) {
  return gate == modtrain::RouterConfig::SIGMOID ? sigmoid(r) : r;
}
}  // namespace

void resolve_stats(std::vector<RoutedBlockStats>& stats) {
  for (auto& s : stats) {
    if (!s.r.defined()) continue;
    fill_stats(s);
    s.r = s.decision = s.member = Tensor();
  }
}

// --- layers ---

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
  const int64_t b = x.size(0), t = x.size(1);
  const int64_t local_heads = wq_->weight().size(0) / head_dim_;  // H / tp under tensor parallelism
  const Shape heads{b, t, local_heads, head_dim_};
  Tensor q = rope(reshape(wq_->forward(x), heads), pos, rope_theta_);
  Tensor k = rope(reshape(wk_->forward(x), heads), pos, rope_theta_);
  Tensor v = reshape(wv_->forward(x), heads);
  Tensor a;
  if (!cache) {
    a = attention(q, k, v, pos);
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

Mlp::Mlp(const modtrain::ModelConfig& cfg, Rng& rng, DType dtype)
    : swiglu_(cfg.mlp() == modtrain::ModelConfig::SWIGLU) {
  const int64_t d = cfg.d_model(), ff = cfg.d_ff();
  const double std = cfg.init_std(), out_std = std / std::sqrt(2.0 * cfg.n_layers());
  up_ = register_module("up", std::make_shared<nn::Linear>(d, ff, false, rng, std, dtype));
  if (swiglu_) gate_ = register_module("gate", std::make_shared<nn::Linear>(d, ff, false, rng, std, dtype));
  down_ = register_module("down", std::make_shared<nn::Linear>(ff, d, false, rng, out_std, dtype));
}

Tensor Mlp::forward(const Tensor& x) const {
  Tensor h = swiglu_ ? swiglu(gate_->forward(x), up_->forward(x)) : gelu(up_->forward(x));
  return down_->forward(h);
}

Router::Router(int64_t d_model, bool bias, Rng& rng, double init_std, DType dtype) {
  proj_ = register_module("proj", std::make_shared<nn::Linear>(d_model, 1, bias, rng, init_std, dtype));
}

Tensor Router::scores(const Tensor& x) const {
  return reshape(proj_->forward(x), {x.size(0), x.size(1)});
}

Predictor::Predictor(int64_t d_model, int64_t hidden, Rng& rng, double init_std, DType dtype) {
  in_ = register_module("in", std::make_shared<nn::Linear>(d_model, hidden, true, rng, init_std, dtype));
  out_ = register_module("out", std::make_shared<nn::Linear>(hidden, 1, true, rng, init_std, dtype));
}

Tensor Predictor::logits(const Tensor& x) const {
  return reshape(out_->forward(silu(in_->forward(x))), {x.size(0), x.size(1)});
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
  if (mod.causal().method() == CausalRoutingConfig::PREDICTOR)
    predictor_ = register_module(
        "predictor",
        std::make_shared<Predictor>(d, mod.causal().predictor_hidden(), rng, cfg.init_std(), dtype));
}

Tensor Block::delta(const Tensor& x, const Tensor& pos, KvCache* cache, RoutingMode mode,
                    ForwardResult* result) const {
  Tensor a = attn_->forward(norm1_->forward(x), pos, cache);
  Tensor h = norm2_->forward(add(x, a));
  if (!moe_) return add(a, mlp_->forward(h));
  if (mode == RoutingMode::Causal) return add(a, moe_->forward_causal(h));
  MoeOutput m = moe_->forward(h);
  if (result) {
    if (m.aux.defined()) result->aux_loss = add_defined(result->aux_loss, m.aux);
    result->moe_stats.push_back(m.stats);
  }
  return add(a, m.out);
}

// --- the model ---

Transformer::Transformer(const modtrain::ModelConfig& cfg, uint64_t seed, DType dtype)
    : cfg_(cfg), routed_(routed_blocks(cfg)), moe_(moe_blocks(cfg)) {
  Rng rng(seed);
  embed_ = register_module(
      "embed", std::make_shared<nn::Embedding>(cfg.vocab_size(), cfg.d_model(), rng, cfg.init_std(), dtype));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int b = 0; b < cfg.n_layers(); ++b)
    blocks_.push_back(list->add(std::make_shared<Block>(cfg, routed_[b], rng, dtype, moe_[b])));
  final_norm_ = register_module("final_norm", std::make_shared<nn::RMSNorm>(cfg.d_model(), cfg.norm_eps(), dtype));
  if (!cfg.tie_embeddings())
    lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(cfg.d_model(), cfg.vocab_size(),
                                                                       false, rng, cfg.init_std(), dtype));
}

int64_t Transformer::capacity(size_t block, int64_t seq_len) const {
  return capacity_tokens(capacity_fraction(cfg_, static_cast<int>(block)), seq_len);
}


Tensor Transformer::head(const Tensor& h) const {
  Tensor n = final_norm_->forward(h);
  return lm_head_ ? lm_head_->forward(n) : embed_->attend(n);
}

TopCRouting route_top_c(const Block& blk, const Tensor& x, const Tensor& pos, int64_t capacity,
                        modtrain::RouterConfig::Gate gate, ForwardResult* result) {
  const int64_t batch = x.size(0), t = x.size(1);
  TopCRouting out;
  out.r = blk.router()->scores(x);                    // [B,T]
  out.idx = topk_rows(out.r, capacity);               // [B,C] ascending, ties to lower
  Tensor f = blk.delta(gather_rows(x, out.idx), gather_positions(pos, out.idx), nullptr,
                       RoutingMode::TopC, result);  // [B,C,D]
  Tensor g = apply_gate(gate, gather_rows(reshape(out.r, {batch, t, 1}), out.idx));  // [B,C,1]
  out.out = scatter_add_rows(x, out.idx, mul(f, g));
  return out;
}

// Routed block in training mode, plus its causal-routing loss and statistics.
Tensor Transformer::routed_top_c(size_t b, const Tensor& x, const Tensor& pos,
                                 ForwardResult& result) const {
  const Block& blk = *blocks_[b];
  const int64_t t = x.size(1);
  auto [out, r, idx] = route_top_c(blk, x, pos, capacity(b, t), cfg_.mod().router().gate(), &result);
  const Tensor member = membership(idx, t, loss_precision(r).dtype());
  const auto& causal = cfg_.mod().causal();
  Tensor decision;
  if (blk.predictor()) {
    Tensor p = blk.predictor()->logits(detach(x));  // detached: the LM loss is untouched
    result.aux_loss = add_defined(result.aux_loss, scale(bce_with_logits(loss_precision(p), member),
                                                         causal.predictor_weight()));
    decision = detach(p);
  } else {
    if (causal.method() == CausalRoutingConfig::AUX_BCE)
      result.aux_loss = add_defined(result.aux_loss, scale(bce_with_logits(loss_precision(r), member),
                                                           causal.aux_weight()));
    decision = detach(r);
  }
  result.routed_idx.push_back(idx);
  RoutedBlockStats s;
  s.block = static_cast<int>(b);
  s.r = detach(r);
  s.decision = decision;
  s.member = detach(member);
  result.stats.push_back(std::move(s));
  return out;
}

// Routed block in causal mode (one sequence, no grad): a token enters iff its own decision
// logit is positive, so nothing after it can change whether it is routed.
Tensor Transformer::routed_causal(size_t b, const Tensor& x) const {
  const Block& blk = *blocks_[b];
  const int64_t t = x.size(1);
  Tensor r = blk.router()->scores(x);
  const Tensor decision = (blk.predictor() ? blk.predictor()->logits(x) : r).to(Device::CPU);
  std::vector<int64_t> chosen;
  for (int64_t i = 0; i < t; ++i)
    if (decision.at(i) > 0) chosen.push_back(i);
  if (chosen.empty()) return x;
  const int64_t c = static_cast<int64_t>(chosen.size());
  const Tensor idx = Tensor::from_indices(chosen, {1, c}).to(x.device());
  Tensor f = blk.delta(gather_rows(x, idx), idx, nullptr, RoutingMode::Causal);
  Tensor g = apply_gate(cfg_.mod().router().gate(), gather_rows(reshape(r, {1, t, 1}), idx));
  return scatter_add_rows(x, idx, mul(f, g));
}

// Made once per shape and device: no host-to-device copy inside a step (a captured step
// could not contain one), and none repeated every forward.
const Tensor& Transformer::positions(int64_t b, int64_t t, Device device) const {
  for (const Tensor& p : positions_)
    if (p.size(0) == b && p.size(1) == t && p.device() == device) return p;
  positions_.push_back(make_positions(b, t, device));
  return positions_.back();
}

Tensor Transformer::run_blocks(Tensor x, RoutingMode mode, ForwardResult& result) const {
  const Tensor pos = positions(x.size(0), x.size(1), x.device());
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const size_t moe_before = result.moe_stats.size();
    if (!routed_[b])
      x = add(x, blocks_[b]->delta(x, pos, nullptr, mode, &result));
    else
      x = mode == RoutingMode::TopC ? routed_top_c(b, x, pos, result) : routed_causal(b, x);
    for (size_t i = moe_before; i < result.moe_stats.size(); ++i)
      result.moe_stats[i].block = static_cast<int>(b);
  }
  return x;
}

ForwardResult Transformer::forward(const Tensor& tokens, const Tensor& targets,
                                   RoutingMode mode) const {
  if (tokens.dim() != 2)
    throw std::invalid_argument("transformer: tokens must be [B,T], got " + describe(tokens));
  if (tokens.size(1) > cfg_.seq_len())
    throw std::invalid_argument("transformer: " + std::to_string(tokens.size(1)) +
                                " tokens exceed model.seq_len " + std::to_string(cfg_.seq_len()));
  ForwardResult result;
  Tensor x = embed_->forward(tokens);  // [B,T,D]
  if (mode == RoutingMode::TopC) {
    x = run_blocks(x, mode, result);
  } else {
    if (grad_enabled())
      throw std::logic_error("causal routing is for evaluation and sampling: use NoGradGuard");
    // Routed counts differ per sequence, so sequences run one at a time.
    Tensor h = Tensor::empty(x.shape(), x.dtype(), x.device());
    for (int64_t s = 0; s < x.size(0); ++s)
      h.narrow0(s, 1).copy_from(run_blocks(x.narrow0(s, 1), mode, result));
    x = h;
  }
  result.logits = head(x);
  if (targets.defined()) {
    const Tensor logits = loss_precision(result.logits);
    result.lm_loss = lm_loss_ ? lm_loss_(logits, targets) : cross_entropy(logits, targets);
    result.loss = result.aux_loss.defined() ? add(result.lm_loss, result.aux_loss) : result.lm_loss;
  }
  return result;
}

std::vector<KvCache> Transformer::make_caches(int64_t max_len) const {
  const int64_t h = cfg_.n_heads(), dh = cfg_.d_model() / cfg_.n_heads();
  std::vector<KvCache> caches(blocks_.size());
  for (auto& c : caches) {
    const Tensor& w = embed_->weight();
    c.k = Tensor::zeros({max_len, h, dh}, w.dtype(), w.device());
    c.v = Tensor::zeros({max_len, h, dh}, w.dtype(), w.device());
  }
  return caches;
}

Tensor Transformer::decode_step(int64_t token, int64_t pos, std::vector<KvCache>& caches) const {
  NoGradGuard no_grad;
  const Device device = embed_->weight().device();
  Tensor x = embed_->forward(Tensor::from_indices({token}, {1, 1}).to(device));
  const Tensor p = Tensor::from_indices({pos}, {1, 1}).to(device);
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = *blocks_[b];
    if (!routed_[b]) {
      x = add(x, blk.delta(x, p, &caches[b], RoutingMode::Causal));
      continue;
    }
    // Skipped (no cache entry, no compute) unless the decision logit is positive; with a
    // predictor the router is read only for tokens that enter.
    if (blk.predictor() && blk.predictor()->logits(x).item() <= 0) continue;
    Tensor r = blk.router()->scores(x);  // [1,1]
    if (!blk.predictor() && r.item() <= 0) continue;
    x = add(x, mul(blk.delta(x, p, &caches[b], RoutingMode::Causal),
                   apply_gate(cfg_.mod().router().gate(), reshape(r, {1, 1, 1}))));
  }
  return head(x).view({cfg_.vocab_size()});
}

}  // namespace mod::model
