// The MoD transformer's forward: blocks in order, routed ones in top-C (training) or causal
// (per-token) mode, with the causal-routing losses and statistics (decoding: decode.cpp).
#include "model/transformer.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>

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

}  // namespace

Transformer::Transformer(const modtrain::ModelConfig& cfg, uint64_t seed, DType dtype,
                         Fusions fusions)
    : cfg_(cfg), routed_(routed_blocks(cfg)), moe_(moe_blocks(cfg)),
      capacity_fractions_(capacity_fractions(cfg)),
      recompute_(cfg.n_layers(), modtrain::TrainConfig::NONE), fusions_(fusions) {
  Rng rng(seed);
  embed_ = register_module(
      "embed", std::make_shared<nn::Embedding>(cfg.vocab_size(), cfg.d_model(), rng, cfg.init_std(), dtype));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int b = 0; b < cfg.n_layers(); ++b)
    blocks_.push_back(
        list->add(std::make_shared<Block>(cfg, routed_[b], rng, dtype, moe_[b], fusions_)));
  final_norm_ = register_module("final_norm", make_norm(cfg, dtype));
  if (!cfg.tie_embeddings())
    lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(cfg.d_model(), cfg.vocab_size(),
                                                                       false, rng, cfg.init_std(), dtype));
}

void Transformer::set_recompute(Recompute mode, const std::vector<int>& blocks) {
  for (int b : blocks)
    if (b < 0 || b >= static_cast<int>(blocks_.size()))
      throw std::invalid_argument("train.recompute_blocks: " + std::to_string(b) +
                                  " is not a block in [0, " + std::to_string(blocks_.size()) + ")");
  std::fill(recompute_.begin(), recompute_.end(),
            blocks.empty() ? mode : modtrain::TrainConfig::NONE);
  for (int b : blocks) recompute_[b] = mode;
}

int64_t Transformer::capacity(size_t block, int64_t seq_len) const {
  return capacity_tokens(capacity_fractions_[block], seq_len);
}

void Transformer::require_causal_decision(const char* what) const {
  if (!cfg_.mod().enabled() || cfg_.mod().causal().method() != CausalRoutingConfig::NONE) return;
  throw std::invalid_argument(
      std::string(what) +
      ": model.mod.causal.method is NONE, so the routed blocks have no causal decision (top-C "
      "routing looks at later tokens); train with causal.method PREDICTOR or AUX_BCE to sample "
      "or evaluate with causal routing");
}

Tensor Transformer::head(const Tensor& h, const Tensor& normed) const {
  Tensor n = normed.defined() ? normed : final_norm_->forward(h);
  return lm_head_ ? lm_head_->forward(n) : embed_->attend(n);
}

// A routed block under top-C routing (training), plus its causal-decision loss and statistics.
Tensor Transformer::top_c_block(size_t b, const Tensor& x, const Tensor& pos,
                                ForwardResult& result) const {
  const Block& blk = *blocks_[b];
  const int64_t t = pos.size(1);
  auto [out, r, r_own, idx] = route_top_c(blk, x, pos, capacity(b, t), cfg_.mod().router().gate(),
                                          &result, recompute_[b], split_.get());
  const Tensor member = membership(idx, t, loss_precision(r).dtype());
  // The causal-decision losses are per position: on a split stream each part takes its own
  // positions' mean, and average_loss makes the mean over all.
  const Tensor member_own = split_ ? split_->own_positions(member) : member;
  auto mean_bce = [&](const Tensor& logits) {
    const Tensor l = bce_with_logits(loss_precision(logits), member_own);
    return split_ ? split_->average_loss(l) : l;
  };
  const auto& causal = cfg_.mod().causal();
  Tensor decision;
  if (blk.predictor()) {
    Tensor p = blk.predictor()->logits(detach(x));  // detached: the LM loss is untouched
    result.add_aux_loss(scale(mean_bce(p), causal.predictor_weight()));
    decision = split_ ? split_->gather_scalars(detach(p)) : detach(p);
  } else {
    if (causal.method() == CausalRoutingConfig::AUX_BCE)
      result.add_aux_loss(scale(mean_bce(r_own), causal.aux_weight()));
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

// A routed block under causal routing (one sequence, no grad): a token enters iff its own
// decision logit is positive, so nothing after it can change whether it is routed.
Tensor Transformer::causal_block(size_t b, const Tensor& x, const Tensor& pos,
                                 ForwardResult& result) const {
  const Block& blk = *blocks_[b];
  const int64_t t = pos.size(1);
  auto whole = [&](const Tensor& own) { return split_ ? split_->gather_scalars(own) : own; };
  Tensor r = whole(blk.router()->scores(x));
  const Tensor decision = (blk.predictor() ? whole(blk.predictor()->logits(x)) : r).to(Device::CPU);
  std::vector<int64_t> chosen;
  Tensor admitted = Tensor::zeros({1, t});  // on the host: read only by statistics and traces
  for (int64_t i = 0; i < t; ++i)
    if (decision.at(i) > 0) {
      chosen.push_back(i);
      admitted.set(i, 1.0);
    }
  RoutedBlockStats s;
  s.block = static_cast<int>(b);
  s.r = r;
  s.decision = decision;
  s.member = admitted;
  result.stats.push_back(std::move(s));
  if (chosen.empty()) return x;
  const int64_t c = static_cast<int64_t>(chosen.size());
  const Tensor idx = Tensor::from_indices(chosen, {1, c}).to(x.device());
  return routed_update(blk, x, pos, r, idx, cfg_.mod().router().gate(), RoutingMode::Causal,
                       nullptr, nullptr, modtrain::TrainConfig::NONE, split_.get());
}

// Made once per shape and device: no host-to-device copy inside a step (a captured step
// could not contain one), and none repeated every forward.
const Tensor& Transformer::positions(int64_t b, int64_t t, Device device) const {
  for (const Tensor& p : positions_)
    if (p.size(0) == b && p.size(1) == t && p.device() == device) return p;
  positions_.push_back(make_positions(b, t, device));
  return positions_.back();
}

// Only a dense block ends in a plain residual add (a routed one's is a scatter). What follows it
// must normalise the whole stream: the final norm, or a dense next block's norm1 when that block
// keeps its activations (a recomputed block's region keeps x alone and runs norm1 inside; taking
// norm1(x) as a second input would keep both). A routed next block reads x in its router and
// normalises only the gathered rows.
const nn::Norm* Transformer::norm_after(size_t b, bool fuse_final_norm, size_t end) const {
  if (!fusions_.add_norm || routed_[b] || units_) return nullptr;
  if (b + 1 == end && end < blocks_.size()) return nullptr;
  if (b + 1 == blocks_.size()) return fuse_final_norm ? final_norm_.get() : nullptr;
  if (routed_[b + 1] || recompute_[b + 1] != modtrain::TrainConfig::NONE) return nullptr;
  return &blocks_[b + 1]->norm1();
}

Residual Transformer::run_blocks(Tensor x, int64_t seq_len, RoutingMode mode,
                                 ForwardResult& result, bool fuse_final_norm, size_t first,
                                 size_t end) const {
  const Tensor pos = positions(x.size(0), seq_len, x.device());
  Residual stream{std::move(x), Tensor()};
  for (size_t b = first; b < end; ++b) {
    const size_t moe_before = result.moe_stats.size();
    if (units_) units_->enter_block(b);
    if (!routed_[b])
      stream = dense_update(*blocks_[b], stream, pos, mode, &result, recompute_[b],
                            norm_after(b, fuse_final_norm, end));
    else  // stream.normed is undefined here: norm_after gives no norm before a routed block
      stream = {mode == RoutingMode::TopC ? top_c_block(b, stream.x, pos, result)
                                          : causal_block(b, stream.x, pos, result),
                Tensor()};
    if (units_) std::tie(stream.x, result.aux_loss) = units_->leave_block(b, stream.x, result.aux_loss);
    for (size_t i = moe_before; i < result.moe_stats.size(); ++i)
      result.moe_stats[i].block = static_cast<int>(b);
  }
  return stream;
}

ForwardResult Transformer::forward(const Tensor& tokens, const Tensor& targets,
                                   RoutingMode mode) const {
  if (tokens.dim() != 2)
    throw std::invalid_argument("transformer: tokens must be [B,T], got " + describe(tokens));
  if (tokens.size(1) > cfg_.seq_len())
    throw std::invalid_argument("transformer: " + std::to_string(tokens.size(1)) +
                                " tokens exceed model.seq_len " + std::to_string(cfg_.seq_len()));
  ForwardResult result;
  const int64_t seq_len = tokens.size(1);
  if (units_) units_->begin_forward();
  Tensor x = embed_->forward(tokens);  // [B,T,D] ([B,T/n,D] on a split stream)
  Tensor normed;                       // final_norm(x) when the last block's add made it
  if (mode == RoutingMode::TopC) {
    Residual out = run_blocks(x, seq_len, mode, result, /*fuse_final_norm=*/true, 0, blocks_.size());
    x = out.x;
    normed = out.normed;
  } else {
    if (grad_enabled())
      throw std::logic_error("causal routing is for evaluation and sampling: use NoGradGuard");
    require_causal_decision("causal routing");
    // Routed counts differ per sequence, so sequences run one at a time.
    Tensor h = Tensor::empty(x.shape(), x.dtype(), x.device());
    for (int64_t s = 0; s < x.size(0); ++s)
      h.narrow0(s, 1).copy_from(
          run_blocks(x.narrow0(s, 1), seq_len, mode, result, false, 0, blocks_.size()).x);
    x = h;
  }
  head_and_loss(result, x, normed, targets);
  if (units_) units_->end_forward();
  return result;
}

ForwardResult Transformer::forward_stage(const Tensor& tokens, const Tensor& x_in, size_t first,
                                         size_t end, const Tensor& targets) const {
  if (first >= end || end > blocks_.size())
    throw std::invalid_argument("transformer: stage blocks [" + std::to_string(first) + ", " +
                                std::to_string(end) + ") is not a range of the " +
                                std::to_string(blocks_.size()) + " blocks");
  ForwardResult result;
  const Tensor x = first == 0 ? embed_->forward(tokens) : x_in;  // [B,T,D] ([B,T/n,D] split)
  const bool last = end == blocks_.size();
  Residual out = run_blocks(x, tokens.size(1), RoutingMode::TopC, result,
                            /*fuse_final_norm=*/last, first, end);
  if (last) {
    head_and_loss(result, out.x, out.normed, targets);
  } else {
    result.hidden = out.x;
    result.loss = result.aux_loss;
  }
  return result;
}

void Transformer::head_and_loss(ForwardResult& result, const Tensor& x, const Tensor& normed,
                                const Tensor& targets) const {
  if (targets.defined() && fused_classifier_ && !lm_loss_) {
    // The head's weight as Linear::forward and Embedding::attend read it (autocast), without
    // their hooks: those are set only under tensor parallelism, which sets lm_loss_.
    const Tensor& w = lm_head_ ? lm_head_->weight() : embed_->weight();
    const Tensor n = normed.defined() ? normed : final_norm_->forward(x);
    result.lm_loss = linear_cross_entropy(autocast(n), autocast(w), targets);
  } else {
    result.logits = head(x, normed);
    if (targets.defined()) {
      const Tensor logits = loss_precision(result.logits);
      result.lm_loss = lm_loss_ ? lm_loss_(logits, targets) : cross_entropy(logits, targets);
    }
  }
  if (targets.defined())
    result.loss = result.aux_loss.defined() ? add(result.lm_loss, result.aux_loss) : result.lm_loss;
}

}  // namespace mod::model
