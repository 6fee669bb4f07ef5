// Sampling's one-token decoding through per-block KV caches: a routed block is entered (and
// its cache grows) only when the token's own decision logit is positive. Two paths: decode_step
// (one sequence, host-side decisions: the reference the tests compare with) and
// decode_batch_step (B sequences, decisions, caches and sampling on the device: `modtrain sample`).
#include <stdexcept>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/transformer.h"

namespace mod::model {

std::vector<KvCache> Transformer::make_caches(int64_t max_len) const {
  require_causal_decision("sampling");
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
  const Tensor row =
      Tensor::from_indices({0}, {1, 1}).to(device);  // the row a routed block updates
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = *blocks_[b];
    if (!routed_[b]) {
      x = blk.update(x, p, &caches[b], RoutingMode::Causal);
      continue;
    }
    // Skipped (no cache entry, no compute) unless the decision logit is positive; with a
    // predictor the router is read only for tokens that enter.
    if (blk.predictor() && blk.predictor()->logits(x).item() <= 0) continue;
    Tensor r = blk.router()->scores(x);  // [1,1]
    if (!blk.predictor() && r.item() <= 0) continue;
    x = routed_update(blk, x, p, r, row, cfg_.mod().router().gate(), RoutingMode::Causal,
                      &caches[b]);
  }
  return head(x).view({cfg_.vocab_size()});
}

}  // namespace mod::model

namespace mod::model {

DecodeState Transformer::make_decode_state(const std::vector<std::vector<int64_t>>& prompts,
                                           const std::vector<int64_t>& stop, int64_t length,
                                           int64_t eot) const {
  require_causal_decision("sampling");
  const int64_t b_n = static_cast<int64_t>(prompts.size());
  if (b_n == 0 || stop.size() != prompts.size())
    throw std::invalid_argument("decode: " + std::to_string(b_n) + " prompts and " +
                                std::to_string(stop.size()) + " stops (one each, at least one)");
  if (length < 2 || length > cfg_.seq_len())
    throw std::invalid_argument("decode: a buffer of " + std::to_string(length) +
                                " tokens must be in [2, model.seq_len " +
                                std::to_string(cfg_.seq_len()) + "]");
  const Tensor& w = embed_->weight();
  DecodeState s;
  s.batch = b_n;
  s.length = length;
  s.eot = eot;
  Tensor tokens = Tensor::zeros({b_n, length}, DType::I64);
  std::vector<int64_t> plen, first;
  for (int64_t b = 0; b < b_n; ++b) {
    const auto& p = prompts[b];
    const int64_t n = static_cast<int64_t>(p.size());
    if (n == 0 || n > stop[b] || stop[b] >= length)
      throw std::invalid_argument("decode: prompt " + std::to_string(b) + " of " +
                                  std::to_string(n) + " tokens with stop " +
                                  std::to_string(stop[b]) + " must have 0 < tokens <= stop < " +
                                  std::to_string(length) + " (the buffer)");
    for (int64_t i = 0; i < n; ++i) tokens.data<int64_t>()[b * length + i] = p[i];
    plen.push_back(n);
    first.push_back(p[0]);
  }
  const Device device = w.device();
  s.tokens = tokens.to(device);
  s.prompt_len = Tensor::from_indices(plen, {b_n}).to(device);
  s.stop = Tensor::from_indices(stop, {b_n}).to(device);
  s.pos = Tensor::zeros({b_n}, DType::I64).to(device);
  s.cur = Tensor::from_indices(first, {b_n}).to(device);
  s.active = Tensor::from_indices(std::vector<int64_t>(b_n, 1), {b_n}).to(device);
  const int64_t h = cfg_.n_heads(), dh = cfg_.d_model() / cfg_.n_heads();
  s.caches.resize(blocks_.size());
  for (auto& c : s.caches) {
    c.k = Tensor::zeros({b_n, length, h, dh}, w.dtype(), device);
    c.v = Tensor::zeros({b_n, length, h, dh}, w.dtype(), device);
    c.len = Tensor::zeros({b_n}, DType::I64).to(device);
  }
  return s;
}

// Steps: embed the current tokens; dense blocks append every active sequence; a routed block's
// decision (predictor, or router logit for AUX_BCE) admits per sequence, and admitted sequences
// alone write their cache and take x + g(r) * f; then the head, the draw and the advance. On a
// device every sequence runs every block and the update is masked (static shapes, no host
// read), and a captured step skips the block when none enters (Backend::run_if_any); on the
// CPU, where reading the flags costs nothing, a routed block runs only its admitted sequences
// (gathered, through routed_update) and is skipped when none enters.
void Transformer::decode_batch_step(DecodeState& s, const SampleArgs& args) const {
  NoGradGuard no_grad;
  const int64_t b_n = s.batch;
  const Tensor pos = s.pos.view({b_n, 1});
  Tensor x = embed_->forward(s.cur.view({b_n, 1}));  // [B,1,D]
  for (size_t b = 0; b < blocks_.size(); ++b) {
    const Block& blk = *blocks_[b];
    KvCache& cache = s.caches[b];
    if (!routed_[b]) {
      cache.admit = s.active;
      x = blk.update(x, pos, &cache, RoutingMode::Causal);
      continue;
    }
    const Tensor r = blk.router()->scores(x);  // [B,1]
    const Tensor decision = blk.predictor() ? blk.predictor()->logits(x) : r;
    cache.admit = decode_admit(decision.view({b_n}), s.active);
    if (cache.admit.device() == Device::CPU) {
      std::vector<int64_t> in;
      for (int64_t i = 0; i < b_n; ++i)
        if (cache.admit.data<int64_t>()[i] != 0) in.push_back(i);
      if (in.empty()) continue;  // nothing enters: no compute, no cache entry
      if (static_cast<int64_t>(in.size()) < b_n) {
        const int64_t n = static_cast<int64_t>(in.size()), d = x.size(2);
        const Tensor idx = Tensor::from_indices(in, {1, n}), admit = cache.admit;
        cache.admit = Tensor();  // every gathered row enters
        cache.rows = idx.view({n});
        x = routed_update(blk, x.view({1, b_n, d}), pos.view({1, b_n}), r.view({1, b_n}), idx,
                          cfg_.mod().router().gate(), RoutingMode::Causal, &cache)
                .view({b_n, 1, d});
        cache.rows = Tensor();
        cache.admit = admit;  // the step's flags, for whoever inspects the cache
        continue;
      }
    }
    // On a device the block's work sits behind its flags: in a captured step it runs only when
    // some sequence enters (a conditional graph node), so a turned-away token skips the block's
    // weights and cache, as on the CPU. x is updated in place: a skipped body leaves it as is.
    const Tensor g = apply_gate(cfg_.mod().router().gate(), reshape(r, {b_n, 1, 1}));
    backend_of(x).run_if_any(cache.admit, [&] {
      x.copy_from(
          masked_add(x, mul(blk.delta(x, pos, &cache, RoutingMode::Causal), g), cache.admit));
    });
  }
  const Tensor logits = head(x).view({b_n, cfg_.vocab_size()});
  const Tensor next = sample_tokens(logits, s.pos, args);
  decode_advance(next, s.prompt_len, s.stop, s.eot, s.tokens, s.pos, s.cur, s.active);
}

}  // namespace mod::model
