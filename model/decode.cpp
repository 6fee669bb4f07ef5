// Sampling's one-token decoding through per-block KV caches: a routed block is entered (and
// its cache grows) only when the token's own decision logit is positive.
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
