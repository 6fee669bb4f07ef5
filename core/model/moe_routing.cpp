// MoE selections (see moe_routing.h).
#include "core/model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <stdexcept>

namespace mod::model {

namespace {
void check_probs(const Tensor& probs, int64_t experts, const char* what) {
  if (probs.dim() != 3 || probs.size(2) != experts)
    throw std::invalid_argument(std::string(what) + ": router probabilities " + describe(probs) +
                                " must be [B,T," + std::to_string(experts) + "]");
}

// The k best of candidates by score (descending, ties to the lower position), ascending.
std::vector<int64_t> top_positions(std::vector<int64_t> candidates, int64_t k,
                                   const std::function<double(int64_t)>& score) {
  auto better = [&](int64_t a, int64_t b) {
    const double sa = score(a), sb = score(b);
    return sa != sb ? sa > sb : a < b;
  };
  std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(), better);
  candidates.resize(k);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

ExpertSlots empty_slots(int64_t b, int64_t t, int64_t e, int64_t k) {
  ExpertSlots s;
  s.batch = b;
  s.tokens = t;
  s.experts = e;
  s.k = k;
  s.token.assign(e * b * k, 0);
  s.valid.assign(e * b * k, 1);
  return s;
}
}  // namespace

int64_t noop_tokens(const modtrain::MoEConfig& cfg, int64_t t) {
  if (!cfg.noop_expert()) return 0;
  return std::clamp<int64_t>(std::llround(cfg.noop_capacity() * static_cast<double>(t)), 0, t);
}

int64_t expert_slots(const modtrain::MoEConfig& cfg, int64_t t) {
  const double e = cfg.n_experts();
  if (cfg.routing() == modtrain::MoEConfig::TOKEN_CHOICE)
    return std::clamp<int64_t>(std::llround(cfg.capacity_factor() * cfg.top_k() * t / e), 1, t);
  const int64_t pool = t - noop_tokens(cfg, t);
  if (pool == 0) return 0;
  return std::clamp<int64_t>(std::llround(cfg.capacity_factor() * pool / e), 1, pool);
}

ExpertSlots expert_choice(const Tensor& probs, const modtrain::MoEConfig& cfg) {
  const int64_t e_real = cfg.n_experts(), e_all = e_real + (cfg.noop_expert() ? 1 : 0);
  check_probs(probs, e_all, "expert_choice");
  const int64_t b = probs.size(0), t = probs.size(1), k = expert_slots(cfg, t),
                n_noop = noop_tokens(cfg, t);
  ExpertSlots s = empty_slots(b, t, e_real, k);
  const Tensor host = probs.to(Device::CPU).to(DType::F64);  // routing runs on the host
  const double* pd = host.data<double>();
  int64_t unrouted = 0;
  for (int64_t r = 0; r < b; ++r) {
    auto p = [&](int64_t pos, int64_t e) { return pd[(r * t + pos) * e_all + e]; };
    std::vector<int64_t> pool(t);
    std::iota(pool.begin(), pool.end(), 0);
    if (n_noop > 0) {
      std::vector<uint8_t> noop(t, 0);
      for (int64_t pos : top_positions(pool, n_noop, [&](int64_t i) { return p(i, e_real); }))
        noop[pos] = 1;
      pool.clear();
      for (int64_t i = 0; i < t; ++i)
        if (!noop[i]) pool.push_back(i);
    }
    std::vector<uint8_t> taken(t, 0);
    for (int64_t e = 0; e < e_real; ++e) {
      const auto chosen = top_positions(pool, k, [&](int64_t i) { return p(i, e); });
      for (int64_t j = 0; j < k; ++j) {
        s.token[(e * b + r) * k + j] = chosen[j];
        taken[chosen[j]] = 1;
      }
    }
    unrouted += t - std::count(taken.begin(), taken.end(), 1);
  }
  s.unrouted_fraction = static_cast<double>(unrouted) / static_cast<double>(b * t);
  s.noop_fraction = static_cast<double>(n_noop) / static_cast<double>(t);
  return s;
}

ExpertSlots token_choice(const Tensor& probs, const modtrain::MoEConfig& cfg) {
  const int64_t e_real = cfg.n_experts(), top = cfg.top_k();
  check_probs(probs, e_real, "token_choice");
  const int64_t b = probs.size(0), t = probs.size(1), k = expert_slots(cfg, t);
  ExpertSlots s = empty_slots(b, t, e_real, k);
  s.all_valid = false;
  s.first_choice_share.assign(b * e_real, 0.0);
  std::fill(s.valid.begin(), s.valid.end(), 0);
  int64_t dropped = 0, unrouted = 0;
  std::vector<double> first_total(e_real, 0.0);
  const Tensor host = probs.to(Device::CPU).to(DType::F64);  // routing runs on the host
  const double* pd = host.data<double>();
  for (int64_t r = 0; r < b; ++r) {
    // choice[i * top + c]: token i's c-th expert.
    std::vector<int64_t> choice(t * top);
    for (int64_t i = 0; i < t; ++i) {
      std::vector<int64_t> order(e_real);
      std::iota(order.begin(), order.end(), 0);
      auto pr = [&](int64_t e) { return pd[(r * t + i) * e_real + e]; };
      std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int64_t a, int64_t c) {
        return pr(a) != pr(c) ? pr(a) > pr(c) : a < c;
      });
      std::copy(order.begin(), order.begin() + top, choice.begin() + i * top);
      s.first_choice_share[r * e_real + order[0]] += 1.0 / static_cast<double>(t);
      first_total[order[0]] += 1.0;
    }
    std::vector<int64_t> used(e_real, 0);
    std::vector<uint8_t> routed(t, 0);
    for (int64_t c = 0; c < top; ++c)
      for (int64_t i = 0; i < t; ++i) {
        const int64_t e = choice[i * top + c];
        if (used[e] == k) {
          ++dropped;
          continue;
        }
        const int64_t slot = (e * b + r) * k + used[e]++;
        s.token[slot] = i;
        s.valid[slot] = 1;
        routed[i] = 1;
      }
    unrouted += t - std::count(routed.begin(), routed.end(), 1);
  }
  const double tokens = static_cast<double>(b * t);
  s.unrouted_fraction = unrouted / tokens;
  s.dropped_fraction = dropped / (tokens * top);
  for (double n : first_total) s.max_load = std::max(s.max_load, n * e_real / tokens);
  return s;
}

}  // namespace mod::model
