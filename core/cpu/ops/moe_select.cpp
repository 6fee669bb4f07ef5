// CPU MoE slot selection (Backend::moe_select; the rules are model/moe_routing.h's):
// sequence by sequence, expert choice takes the k best tokens per expert after the no-op
// expert's picks left the pool, token choice places first choices in position order, then
// second choices, into K slots per expert. Scores are compared in the probabilities' own dtype
// (every comparison and equality is the same as in f64).
#include <algorithm>
#include <numeric>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
// The k best of candidates by score (descending, ties to the lower position), ascending.
template <typename Score>
std::vector<int64_t> top_positions(std::vector<int64_t> candidates, int64_t k, Score score) {
  auto better = [&](int64_t a, int64_t b) {
    const auto sa = score(a), sb = score(b);
    return sa != sb ? sa > sb : a < b;
  };
  std::nth_element(candidates.begin(), candidates.begin() + k, candidates.end(), better);
  candidates.resize(k);
  std::sort(candidates.begin(), candidates.end());
  return candidates;
}

struct Slots {
  int64_t* rows;
  int64_t* gate_rows;
  int64_t b, t, e_all, k;
  void put(int64_t e, int64_t r, int64_t j, int64_t token) const {
    const int64_t slot = (e * b + r) * k + j, row = r * t + token;
    rows[slot] = row;
    gate_rows[slot] = row * e_all + e;
  }
};

// Sequence r under expert choice; returns the tokens no real expert took.
template <typename T>
int64_t expert_choice_row(const T* p, const MoeSelectArgs& a, const Slots& s, int64_t r) {
  const int64_t t = s.t, e_all = s.e_all;
  auto score = [&](int64_t e) { return [=](int64_t pos) { return p[(r * t + pos) * e_all + e]; }; };
  std::vector<int64_t> pool(t);
  std::iota(pool.begin(), pool.end(), 0);
  if (a.noop > 0) {
    std::vector<uint8_t> noop(t, 0);
    for (int64_t pos : top_positions(pool, a.noop, score(a.experts))) noop[pos] = 1;
    pool.clear();
    for (int64_t i = 0; i < t; ++i)
      if (!noop[i]) pool.push_back(i);
  }
  std::vector<uint8_t> taken(t, 0);
  for (int64_t e = 0; e < a.experts && a.k > 0; ++e) {
    const auto chosen = top_positions(pool, a.k, score(e));
    for (int64_t j = 0; j < a.k; ++j) {
      s.put(e, r, j, chosen[j]);
      taken[chosen[j]] = 1;
    }
  }
  return t - std::count(taken.begin(), taken.end(), 1);
}

// Sequence r under token choice: fills its slots (empty ones invalid), its first-choice counts
// per expert, and returns {tokens no expert took, choices dropped}.
template <typename T>
std::pair<int64_t, int64_t> token_choice_row(const T* p, const MoeSelectArgs& a, const Slots& s,
                                             int64_t r, T* valid, std::vector<int64_t>& first) {
  const int64_t t = s.t, e_real = a.experts, top = a.top_k;
  std::vector<int64_t> choice(t * top);  // choice[i * top + c]: token i's c-th expert
  for (int64_t i = 0; i < t; ++i) {
    std::vector<int64_t> order(e_real);
    std::iota(order.begin(), order.end(), 0);
    const T* pr = p + (r * t + i) * s.e_all;
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](int64_t x, int64_t y) { return pr[x] != pr[y] ? pr[x] > pr[y] : x < y; });
    std::copy(order.begin(), order.begin() + top, choice.begin() + i * top);
    ++first[order[0]];
  }
  std::vector<int64_t> used(e_real, 0);
  std::vector<uint8_t> routed(t, 0);
  int64_t dropped = 0;
  for (int64_t c = 0; c < top; ++c)
    for (int64_t i = 0; i < t; ++i) {
      const int64_t e = choice[i * top + c];
      if (used[e] == s.k) {
        ++dropped;
        continue;
      }
      valid[(e * s.b + r) * s.k + used[e]] = T(1);
      s.put(e, r, used[e]++, i);
      routed[i] = 1;
    }
  return {t - std::count(routed.begin(), routed.end(), 1), dropped};
}
}  // namespace

void CpuBackend::moe_select(const Tensor& probs, const MoeSelectArgs& a, Tensor& rows,
                            Tensor& gate_rows, Tensor& valid, Tensor& share, Tensor& counts) {
  const int64_t b = probs.size(0), t = probs.size(1), e_all = probs.size(2);
  const Slots s{rows.data<int64_t>(), gate_rows.data<int64_t>(), b, t, e_all, a.k};
  double* cnt = counts.data<double>();
  dispatch_float(probs.dtype(), "moe_select", [&](auto z) {
    using T = decltype(z);
    const T* p = probs.data<T>();
    T* v = valid.data<T>();
    T* sh = share.data<T>();
    // Every slot starts empty (token 0, invalid under token choice); selections overwrite.
    for (int64_t e = 0; e < a.experts; ++e)
      for (int64_t r = 0; r < b; ++r)
        for (int64_t j = 0; j < a.k; ++j) {
          s.put(e, r, j, 0);
          v[(e * b + r) * a.k + j] = a.token_choice ? T(0) : T(1);
        }
    std::fill_n(sh, b * a.experts, T(0));
    for (int64_t r = 0; r < b; ++r) {
      if (!a.token_choice) {
        cnt[r * 2] = static_cast<double>(expert_choice_row(p, a, s, r));
        cnt[r * 2 + 1] = 0;
        continue;
      }
      std::vector<int64_t> first(a.experts, 0);
      const auto [unrouted, dropped] = token_choice_row(p, a, s, r, v, first);
      cnt[r * 2] = static_cast<double>(unrouted);
      cnt[r * 2 + 1] = static_cast<double>(dropped);
      for (int64_t e = 0; e < a.experts; ++e)
        sh[r * a.experts + e] =
            static_cast<T>(static_cast<double>(first[e]) / static_cast<double>(t));
    }
  });
}

}  // namespace mod::cpu
