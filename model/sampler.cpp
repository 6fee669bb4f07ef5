// Sampling: temperature, top-k and top-p filtering over one logits row.
#include "model/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace mod::model {

int64_t sample_token(const Tensor& logits, const SamplingParams& p, Rng& rng) {
  const int64_t v = logits.numel();
  const std::vector<double> l = logits.to_vector();  // one copy to the host where it is a GPU's
  if (p.temperature <= 0) return std::max_element(l.begin(), l.end()) - l.begin();
  std::vector<int64_t> order(v);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
  const int64_t keep_k = p.top_k > 0 ? std::min(p.top_k, v) : v;
  std::vector<double> prob(keep_k);
  double z = 0;
  for (int64_t i = 0; i < keep_k; ++i) {
    prob[i] = std::exp((l[order[i]] - l[order[0]]) / p.temperature);
    z += prob[i];
  }
  int64_t keep = keep_k;
  double mass = 0;
  for (int64_t i = 0; i < keep_k; ++i) {
    prob[i] /= z;
    mass += prob[i];
    if (mass >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  double u = rng.uniform() * std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  for (int64_t i = 0; i < keep; ++i) {
    u -= prob[i];
    if (u <= 0) return order[i];
  }
  return order[keep - 1];
}

Generation generate(const Transformer& model, const std::vector<int64_t>& prompt, int64_t max_new,
                    const SamplingParams& params) {
  if (prompt.empty()) throw std::invalid_argument("sample: the prompt is empty");
  const int64_t max_len = model.config().seq_len();
  if (static_cast<int64_t>(prompt.size()) >= max_len)
    throw std::invalid_argument("sample: prompt of " + std::to_string(prompt.size()) +
                                " tokens leaves no room in model.seq_len " + std::to_string(max_len));
  Rng rng(params.seed);
  auto caches = model.make_caches(max_len);
  const auto t0 = std::chrono::steady_clock::now();
  Generation g;
  Tensor logits;
  int64_t pos = 0;
  for (int64_t tok : prompt) logits = model.decode_step(tok, pos++, caches);
  while (static_cast<int64_t>(g.tokens.size()) < max_new && pos < max_len) {
    const int64_t next = sample_token(logits, params, rng);
    g.tokens.push_back(next);
    // The last token that fits is not fed: its logits would predict past model.seq_len.
    if (static_cast<int64_t>(g.tokens.size()) == max_new || pos + 1 >= max_len) break;
    logits = model.decode_step(next, pos++, caches);
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t b = 0; b < caches.size(); ++b) {
    if (!model.routed(b)) continue;
    g.admitted.push_back(caches[b].size());
    g.seen.push_back(pos);
  }
  return g;
}

}  // namespace mod::model
