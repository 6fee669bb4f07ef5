// Mixture-of-experts slot selection (docs/architecture.md section 3): expert choice and token choice
// against hand-built and brute-force answers; capacity rounding, ties, per-sequence routing,
// the no-op expert and token-choice overflow.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "core/all_ops.h"
#include "core/random.h"
#include "model/moe_routing.h"

using namespace mod;
using namespace mod::model;

namespace {
// Softmax rows of normal(0, 2) logits [B,T,E], in f64: distinct values, no ties.
Tensor random_probs(int64_t b, int64_t t, int64_t e, uint64_t seed) {
  Rng rng(seed);
  NoGradGuard g;
  return softmax(randn({b, t, e}, rng, DType::F64, 2.0));
}

modtrain::MoEConfig expert_choice_cfg(int experts, double capacity_factor) {
  modtrain::MoEConfig c;
  c.set_enabled(true);
  c.set_n_experts(experts);
  c.set_routing(modtrain::MoEConfig::EXPERT_CHOICE);
  c.set_capacity_factor(capacity_factor);
  return c;
}

modtrain::MoEConfig token_choice_cfg(int experts, double capacity_factor, int top_k) {
  modtrain::MoEConfig c = expert_choice_cfg(experts, capacity_factor);
  c.set_routing(modtrain::MoEConfig::TOKEN_CHOICE);
  c.set_top_k(top_k);
  return c;
}

// The K slot entries of (expert e, sequence b), in slot order.
std::vector<int64_t> slots_of(const ExpertSlots& s, int64_t e, int64_t b) {
  const auto first = s.token.begin() + (e * s.batch + b) * s.k;
  return {first, first + s.k};
}
std::vector<uint8_t> valid_of(const ExpertSlots& s, int64_t e, int64_t b) {
  const auto first = s.valid.begin() + (e * s.batch + b) * s.k;
  return {first, first + s.k};
}

// Brute force: the k positions of sequence b outside `excluded` with the highest probs[b,:,e]
// (ties to the lower position), ascending.
std::vector<int64_t> brute_top(const Tensor& probs, int64_t b, int64_t e, int64_t k,
                               const std::set<int64_t>& excluded = {}) {
  const int64_t t = probs.size(1), n = probs.size(2);
  std::vector<std::pair<double, int64_t>> scored;
  for (int64_t i = 0; i < t; ++i)
    if (!excluded.count(i)) scored.push_back({-probs.at((b * t + i) * n + e), i});
  std::sort(scored.begin(), scored.end());
  std::vector<int64_t> top;
  for (int64_t j = 0; j < k; ++j) top.push_back(scored[j].second);
  std::sort(top.begin(), top.end());
  return top;
}
}  // namespace

// --- selections ---

TEST_CASE("expert_slots and noop_tokens follow the documented rounding and clamps", "[moe]") {
  auto ec = expert_choice_cfg(4, 1.0);
  CHECK(noop_tokens(ec, 12) == 0);
  CHECK(expert_slots(ec, 12) == 3);
  ec.set_capacity_factor(0.01);
  CHECK(expert_slots(ec, 12) == 1);  // at least one slot
  ec.set_capacity_factor(4.0);
  CHECK(expert_slots(ec, 12) == 12);  // at most every token
  auto noop = expert_choice_cfg(2, 1.0);
  noop.set_noop_expert(true);
  noop.set_noop_capacity(0.25);
  CHECK(noop_tokens(noop, 12) == 3);
  CHECK(expert_slots(noop, 12) == 5);  // round(9 / 2 = 4.5) = 5
  noop.set_noop_capacity(0.0);
  CHECK(noop_tokens(noop, 12) == 0);
  CHECK(expert_slots(noop, 12) == 6);
  noop.set_noop_capacity(1.0);
  CHECK(noop_tokens(noop, 12) == 12);
  CHECK(expert_slots(noop, 12) == 0);
  auto tc = token_choice_cfg(4, 1.25, 2);
  CHECK(expert_slots(tc, 12) == 8);  // round(1.25 * 2 * 12 / 4 = 7.5)
  tc.set_capacity_factor(4.0);
  CHECK(expert_slots(tc, 12) == 12);
}

TEST_CASE("expert choice: each expert takes its k best tokens of each sequence, ascending",
          "[moe]") {
  const auto cfg = expert_choice_cfg(4, 1.0);
  const Tensor probs = random_probs(3, 12, 4, 1);
  const ExpertSlots s = expert_choice(probs, cfg);
  REQUIRE(s.k == 3);
  REQUIRE(s.token.size() == 4 * 3 * 3);
  CHECK(s.all_valid);
  std::set<std::pair<int64_t, int64_t>> taken;
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t e = 0; e < 4; ++e) {
      INFO("sequence " << b << " expert " << e);
      const auto got = slots_of(s, e, b);
      CHECK(got == brute_top(probs, b, e, 3));  // also: ascending and distinct
      CHECK(std::adjacent_find(got.begin(), got.end(), std::greater_equal<>()) == got.end());
      for (int64_t t : got) taken.insert({b, t});
    }
  CHECK(s.unrouted_fraction == Approx(1.0 - taken.size() / 36.0).margin(1e-15));
  CHECK(s.noop_fraction == 0.0);
}

TEST_CASE("expert choice breaks ties to the lower position", "[moe]") {
  // k = round(2/3 * 6 / 2) = 2. Expert 0 ties at 0.5 on positions 1, 3, 4; expert 1 at 0.9 on
  // 0, 2, 5. (The selection reads the values only; rows sum to 1 anyway.)
  const auto cfg = expert_choice_cfg(2, 2.0 / 3.0);
  const std::vector<double> p0{0.1, 0.5, 0.1, 0.5, 0.5, 0.1};
  std::vector<double> v;
  for (double p : p0) {
    v.push_back(p);
    v.push_back(1.0 - p);
  }
  const ExpertSlots s = expert_choice(Tensor::from_vector(v, {1, 6, 2}, DType::F64), cfg);
  REQUIRE(s.k == 2);
  CHECK(slots_of(s, 0, 0) == std::vector<int64_t>{1, 3});
  CHECK(slots_of(s, 1, 0) == std::vector<int64_t>{0, 2});
  CHECK(s.unrouted_fraction == Approx(2.0 / 6.0));  // positions 4 and 5
  // All equal: every expert takes the first k positions (experts may share tokens).
  const ExpertSlots flat = expert_choice(Tensor::full({1, 6, 2}, 0.5, DType::F64), cfg);
  CHECK(slots_of(flat, 0, 0) == std::vector<int64_t>{0, 1});
  CHECK(slots_of(flat, 1, 0) == std::vector<int64_t>{0, 1});
}

TEST_CASE("expert choice routes per sequence: a batch of two gives each sequence's own slots",
          "[moe]") {
  const auto cfg = expert_choice_cfg(4, 1.0);
  const Tensor probs = random_probs(2, 12, 4, 2);
  const ExpertSlots both = expert_choice(probs, cfg);
  for (int64_t b = 0; b < 2; ++b) {
    const ExpertSlots alone = expert_choice(probs.narrow0(b, 1).clone(), cfg);
    for (int64_t e = 0; e < 4; ++e) {
      INFO("sequence " << b << " expert " << e);
      CHECK(slots_of(both, e, b) == slots_of(alone, e, 0));
    }
  }
  // Sequence 1 made to want the same tokens as sequence 0 everywhere: sequence 0 is unchanged
  // (a batch-level top-k would now split the slots between them).
  Tensor same = probs.clone();
  same.narrow0(1, 1).copy_from(probs.narrow0(0, 1));
  const ExpertSlots twins = expert_choice(same, cfg);
  for (int64_t e = 0; e < 4; ++e) {
    CHECK(slots_of(twins, e, 0) == slots_of(both, e, 0));
    CHECK(slots_of(twins, e, 1) == slots_of(both, e, 0));
  }
}

TEST_CASE("expert choice with a no-op expert: its tokens leave the pool before the experts choose",
          "[moe]") {
  SECTION("hand-built") {
    // T = 8, E = 2, noop_capacity 0.25: the no-op expert takes 2 tokens, each real expert
    // k = round(6 / 2) = 3. Columns: expert 0, expert 1, no-op. Positions 0 and 1 have the
    // highest no-op probability; position 0 is also expert 0's favourite, and must not be taken.
    auto cfg = expert_choice_cfg(2, 1.0);
    cfg.set_noop_expert(true);
    cfg.set_noop_capacity(0.25);
    const std::vector<double> v{0.45, 0.05, 0.5, 0.1,  0.1,  0.8, 0.2, 0.4, 0.4, 0.4,  0.3,  0.3,
                                0.3,  0.5,  0.2, 0.35, 0.45, 0.2, 0.1, 0.6, 0.3, 0.25, 0.35, 0.4};
    const ExpertSlots s = expert_choice(Tensor::from_vector(v, {1, 8, 3}, DType::F64), cfg);
    REQUIRE(s.k == 3);
    CHECK(slots_of(s, 0, 0) == std::vector<int64_t>{3, 4, 5});
    CHECK(slots_of(s, 1, 0) == std::vector<int64_t>{4, 5, 6});
    CHECK(s.noop_fraction == 0.25);
    CHECK(s.unrouted_fraction == 0.5);  // 0, 1 (no-op), 2, 7 (nobody's top 3)
  }
  SECTION("random, against brute force") {
    auto cfg = expert_choice_cfg(2, 1.0);
    cfg.set_noop_expert(true);
    cfg.set_noop_capacity(0.25);
    const Tensor probs = random_probs(2, 12, 3, 3);
    const ExpertSlots s = expert_choice(probs, cfg);
    REQUIRE(s.k == 5);
    std::set<std::pair<int64_t, int64_t>> taken;
    for (int64_t b = 0; b < 2; ++b) {
      const auto noop = brute_top(probs, b, 2, 3);
      const std::set<int64_t> excluded(noop.begin(), noop.end());
      for (int64_t e = 0; e < 2; ++e) {
        INFO("sequence " << b << " expert " << e);
        const auto got = slots_of(s, e, b);
        CHECK(got == brute_top(probs, b, e, 5, excluded));
        for (int64_t t : got) {
          CHECK_FALSE(excluded.count(t));
          taken.insert({b, t});
        }
      }
    }
    CHECK(s.noop_fraction == 0.25);
    CHECK(s.unrouted_fraction == Approx(1.0 - taken.size() / 24.0).margin(1e-15));
  }
  SECTION("noop_capacity 1: no slots, every token unrouted") {
    auto cfg = expert_choice_cfg(2, 1.0);
    cfg.set_noop_expert(true);
    cfg.set_noop_capacity(1.0);
    const ExpertSlots s = expert_choice(random_probs(2, 12, 3, 4), cfg);
    CHECK(s.k == 0);
    CHECK(s.token.empty());
    CHECK(s.noop_fraction == 1.0);
    CHECK(s.unrouted_fraction == 1.0);
  }
}

TEST_CASE("token choice: first choices in position order, then second choices, overflow dropped",
          "[moe]") {
  SECTION("top 1: the third token that wants a full expert is dropped") {
    // T = 4, E = 2, K = round(1 * 4 / 2) = 2. Tokens 0, 1, 2 want expert 0; token 3 expert 1.
    const auto cfg = token_choice_cfg(2, 1.0, 1);
    const std::vector<double> v{0.9, 0.1, 0.8, 0.2, 0.95, 0.05, 0.3, 0.7};
    const ExpertSlots s = token_choice(Tensor::from_vector(v, {1, 4, 2}, DType::F64), cfg);
    REQUIRE(s.k == 2);
    CHECK_FALSE(s.all_valid);
    CHECK(slots_of(s, 0, 0) == std::vector<int64_t>{0, 1});  // not 2, despite its 0.95
    CHECK(valid_of(s, 0, 0) == std::vector<uint8_t>{1, 1});
    CHECK(slots_of(s, 1, 0)[0] == 3);
    CHECK(valid_of(s, 1, 0) == std::vector<uint8_t>{1, 0});  // one empty slot
    CHECK(s.dropped_fraction == 0.25);
    CHECK(s.unrouted_fraction == 0.25);
    CHECK(s.first_choice_share == std::vector<double>{0.75, 0.25});
    CHECK(s.max_load == 1.5);  // E * 3/4
  }
  SECTION("top 2") {
    // T = 4, E = 3, K = round(0.75 * 2 * 4 / 3) = 2. First choices: 0, 0, 0, 2; second: 1, 2, 1, 1.
    // Pass 1: e0 <- 0, 1; token 2 dropped; e2 <- 3. Pass 2: e1 <- 0; e2 <- 1; e1 <- 2; token 3's
    // second choice (e1) is full and dropped.
    const auto cfg = token_choice_cfg(3, 0.75, 2);
    const std::vector<double> v{0.6, 0.3, 0.1, 0.5, 0.1, 0.4, 0.7, 0.2, 0.1, 0.1, 0.2, 0.7};
    const ExpertSlots s = token_choice(Tensor::from_vector(v, {1, 4, 3}, DType::F64), cfg);
    REQUIRE(s.k == 2);
    CHECK(slots_of(s, 0, 0) == std::vector<int64_t>{0, 1});
    CHECK(slots_of(s, 1, 0) == std::vector<int64_t>{0, 2});
    CHECK(slots_of(s, 2, 0) == std::vector<int64_t>{3, 1});  // placement order, not position
    for (int64_t e = 0; e < 3; ++e) CHECK(valid_of(s, e, 0) == std::vector<uint8_t>{1, 1});
    CHECK(s.dropped_fraction == 0.25);  // 2 of 8 choices
    CHECK(s.unrouted_fraction == 0.0);  // token 2 made it through its second choice
    CHECK(s.first_choice_share == std::vector<double>{0.75, 0.0, 0.25});
    CHECK(s.max_load == Approx(2.25));
  }
  SECTION("ties go to the lower expert; capacity is per sequence") {
    // Two identical sequences of 4 tokens with equal probabilities: every first choice is expert
    // 0, K = 2 per sequence, so each sequence drops its tokens 2 and 3.
    const auto cfg = token_choice_cfg(2, 1.0, 1);
    const ExpertSlots s = token_choice(Tensor::full({2, 4, 2}, 0.5, DType::F64), cfg);
    for (int64_t b = 0; b < 2; ++b) {
      CHECK(slots_of(s, 0, b) == std::vector<int64_t>{0, 1});
      CHECK(valid_of(s, 0, b) == std::vector<uint8_t>{1, 1});
      CHECK(valid_of(s, 1, b) == std::vector<uint8_t>{0, 0});
    }
    CHECK(s.dropped_fraction == 0.5);
    CHECK(s.first_choice_share == std::vector<double>{1.0, 0.0, 1.0, 0.0});
    CHECK(s.max_load == 2.0);
  }
}
