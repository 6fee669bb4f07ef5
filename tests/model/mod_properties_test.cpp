// The Mixture-of-Depths invariants of docs/architecture.md section 3, each as a test that fails when the
// invariant breaks: dense equivalence at capacity 1, exactly C sorted routed tokens, original
// positions, the router on the gradient path, causal routing, and
// incremental decoding through the ragged KV caches (per-sequence BCE targets and more:
// mod_fidelity_test.cpp).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "core/all_ops.h"
#include "model/transformer.h"
#include "tests/support/grad_check.h"
#include "tests/support/tiny_configs.h"

using mod::test::arange_positions;
using mod::test::max_diff;
using mod::test::tokens_for;

using namespace mod;
using namespace mod::model;

namespace {
void set_all(Tensor t, double v) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
}
}  // namespace

TEST_CASE("capacity 1 with identity gate and r = 1 reproduces the dense model and gradients",
          "[mod]") {
  auto routed_cfg = test::tiny_model(/*mod=*/true);
  routed_cfg.mutable_mod()->set_capacity(1.0);
  routed_cfg.mutable_mod()->set_schedule(modtrain::MoDConfig::EVERY);
  routed_cfg.mutable_mod()->mutable_router()->set_bias(true);
  routed_cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::NONE);
  auto dense_cfg = routed_cfg;
  dense_cfg.mutable_mod()->set_enabled(false);
  Transformer routed(routed_cfg, 3, DType::F64), dense(dense_cfg, 4, DType::F64);
  for (auto& [name, p] : routed.named_parameters()) {
    if (name.find("router") != std::string::npos) {
      set_all(p, name.ends_with("bias") ? 1.0 : 0.0);  // r = 0.x + 1 for every token
    } else {
      Tensor d = dense.parameter(name);
      d.copy_from(p);
    }
  }
  Tensor tok = tokens_for(2, 12, 32, 9), tgt = tokens_for(2, 12, 32, 10);
  auto r = routed.forward(tok, tgt), d = dense.forward(tok, tgt);
  CHECK(max_diff(r.logits, d.logits) < 1e-12);
  r.loss.backward();
  d.loss.backward();
  for (auto& [name, p] : dense.named_parameters()) {
    INFO(name);
    CHECK(max_diff(p.grad(), routed.parameter(name).grad()) < 1e-12);
  }
}

TEST_CASE("exactly C tokens are routed per sequence, ascending, ties to the lower position",
          "[mod]") {
  auto cfg = test::tiny_model(true);
  Rng rng(5);
  Block block(cfg, /*routed=*/true, rng, DType::F64);
  Tensor x = randn({3, 12, 16}, rng, DType::F64);
  auto out = route_top_c(block, x, arange_positions(3, 12), 4, modtrain::RouterConfig::IDENTITY);
  REQUIRE(out.idx.shape() == Shape{3, 4});
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<std::pair<double, int64_t>> scored;
    for (int64_t t = 0; t < 12; ++t) scored.push_back({-out.r.at(b * 12 + t), t});
    std::sort(scored.begin(), scored.end());
    std::vector<int64_t> want;
    for (int k = 0; k < 4; ++k) want.push_back(scored[k].second);
    std::sort(want.begin(), want.end());
    for (int k = 0; k < 4; ++k) CHECK(out.idx.at(b * 4 + k) == want[k]);
  }
  // All scores equal: the first C positions win, in every sequence.
  Tensor tied = Tensor::zeros({2, 12, 16}, DType::F64);
  auto t = route_top_c(block, tied, arange_positions(2, 12), 4, modtrain::RouterConfig::IDENTITY);
  CHECK(t.idx.to_vector() == std::vector<double>{0, 1, 2, 3, 0, 1, 2, 3});
}

TEST_CASE("routed tokens attend and rotate at their original positions, others pass unchanged",
          "[mod]") {
  auto cfg = test::tiny_model(true);
  Rng rng(6);
  Block block(cfg, true, rng, DType::F64);
  Tensor x = randn({2, 12, 16}, rng, DType::F64);
  auto out = route_top_c(block, x, arange_positions(2, 12), 4, modtrain::RouterConfig::IDENTITY);
  Tensor sub = gather_rows(x, out.idx);
  Tensor f = block.delta(sub, out.idx);  // the dense block on the sub-sequence, true positions
  Tensor squeezed = block.delta(sub, arange_positions(2, 4));  // the bug: positions 0..C-1
  for (int64_t b = 0; b < 2; ++b) {
    std::vector<bool> chosen(12, false);
    for (int64_t c = 0; c < 4; ++c) {
      const int64_t t = static_cast<int64_t>(out.idx.at(b * 4 + c));
      chosen[t] = true;
      const double r = out.r.at(b * 12 + t);
      for (int64_t d = 0; d < 16; ++d)
        CHECK(out.out.at((b * 12 + t) * 16 + d) ==
              Approx(x.at((b * 12 + t) * 16 + d) + r * f.at((b * 4 + c) * 16 + d)).margin(1e-12));
    }
    for (int64_t t = 0; t < 12; ++t)
      if (!chosen[t])
        for (int64_t d = 0; d < 16; ++d)
          CHECK(out.out.at((b * 12 + t) * 16 + d) == x.at((b * 12 + t) * 16 + d));
  }
  CHECK(max_diff(f, squeezed) > 1e-6);  // positions matter, so the test above can fail
}

TEST_CASE("the router weight gets a finite-difference-checked gradient through x + r * f",
          "[mod][grad]") {
  auto cfg = test::tiny_model(true);
  Rng rng(7);
  auto block = std::make_shared<Block>(cfg, true, rng, DType::F64);
  const Tensor pos = arange_positions(2, 8);
  test::GradCase c{"MoD block [2,8,16] C=3", Op::GatherRows,
                   [&](Rng& r) {
                     return std::vector<Tensor>{randn({2, 8, 16}, r, DType::F64).set_requires_grad(true),
                                                block->parameter("router.proj.weight"),
                                                block->parameter("attn.wq.weight")};
                   },
                   [&](const std::vector<Tensor>& in) {
                     return route_top_c(*block, in[0], pos, 3, modtrain::RouterConfig::IDENTITY).out;
                   }};
  const auto report = test::check_gradients(c, 11);
  INFO(report.worst << " (" << report.worst_error << ")");
  CHECK(report.ok);
  const Tensor& g = block->parameter("router.proj.weight").grad();
  REQUIRE(g.defined());
  double norm = 0;
  for (double v : g.to_vector()) norm += v * v;
  CHECK(norm > 1e-8);
}

TEST_CASE("in causal routing mode, later tokens never change earlier logits", "[mod]") {
  auto cfg = test::tiny_model(true);
  // f64, because the routed sub-sequences differ in length between the two inputs and a GEMM's
  // rounding may depend on its row count; a leak of the future would be far above 1e-12.
  Transformer m(cfg, 12, DType::F64);
  NoGradGuard g;
  Tensor a = tokens_for(1, 12, 32, 31);
  Tensor b = a.clone();
  for (int64_t t = 7; t < 12; ++t) b.set(t, (static_cast<int64_t>(a.at(t)) + 5) % 32);
  auto la = m.forward(a, Tensor(), RoutingMode::Causal).logits;
  auto lb = m.forward(b, Tensor(), RoutingMode::Causal).logits;
  for (int64_t i = 0; i < 7 * 32; ++i) CHECK(la.at(i) == Approx(lb.at(i)).margin(1e-12));
  CHECK(max_diff(la, lb) > 1e-6);  // positions 7.. did change
  // Top-C routing, by contrast, peeks at the future: some earlier logit may move. (Not asserted:
  // it depends on whether the change reorders the top-C set.)
}

TEST_CASE("incremental decoding with ragged KV caches equals the causal forward", "[mod]") {
  for (bool routed : {false, true}) {
    auto cfg = test::tiny_model(routed);
    Transformer m(cfg, 13, DType::F64);
    Tensor tok = tokens_for(1, 12, 32, 41);
    NoGradGuard g;
    Tensor full = m.forward(tok, Tensor(), RoutingMode::Causal).logits;  // [1,12,32]
    auto caches = m.make_caches(12);
    for (int64_t t = 0; t < 12; ++t) {
      Tensor step = m.decode_step(static_cast<int64_t>(tok.at(t)), t, caches);
      for (int64_t v = 0; v < 32; ++v) CHECK(step.at(v) == Approx(full.at(t * 32 + v)).margin(1e-10));
    }
    if (routed) {
      // The routed block cached only the tokens it admitted: fewer than all, more than none.
      INFO("admitted " << caches[1].size());
      CHECK(caches[1].size() < 12);
      CHECK(caches[1].size() > 0);
      CHECK(caches[0].size() == 12);
    }
  }
}

// The forward leaves each routed block's statistics as tensors (no host copy mid-forward);
// resolve_stats turns them into numbers that agree with those tensors, then drops them.
TEST_CASE("routed-block statistics resolve after the forward to the values of its tensors",
          "[mod]") {
  Transformer m(test::tiny_model(true), 17, DType::F64);
  std::vector<int64_t> ids(2 * 12);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 32);
  const Tensor tokens = Tensor::from_indices(ids, {2, 12});
  auto stats = m.forward(tokens, tokens).stats;
  REQUIRE(stats.size() == 1);  // blocks 0 and 1: the second is routed
  REQUIRE(stats[0].r.defined());
  CHECK(stats[0].block == 1);
  CHECK(stats[0].router_std == 0.0);  // nothing computed yet
  const std::vector<double> r = stats[0].r.to_vector(), decision = stats[0].decision.to_vector(),
                            member = stats[0].member.to_vector();
  resolve_stats(stats);
  const auto& s = stats[0];
  CHECK_FALSE(s.r.defined());
  double sum = 0, sq = 0, agree = 0, routed = 0, tp = 0, said = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    sum += r[i];
    sq += r[i] * r[i];
    agree += (decision[i] > 0) == (member[i] > 0.5);
    routed += member[i];
    tp += decision[i] > 0 && member[i] > 0.5;
    said += decision[i] > 0;
  }
  const double n = static_cast<double>(r.size()), mean = sum / n;
  CHECK(routed == 2 * 3);  // C = 3 of 12 per sequence
  CHECK(s.router_mean == Approx(mean).margin(1e-12));
  CHECK(s.router_std == Approx(std::sqrt(sq / n - mean * mean)).margin(1e-12));
  CHECK(s.router_std > 0);
  CHECK(s.accuracy == Approx(agree / n));
  CHECK(s.precision == Approx(said > 0 ? tp / said : 0.0));
  CHECK(s.recall == Approx(tp / routed));
  // The histogram the host would make of r, bucket for bucket.
  const util::Histogram want = util::make_histogram(r, RoutingSummary::kHistogramBuckets);
  CHECK(s.router_histogram.upper == want.upper);
  CHECK(s.router_histogram.count == want.count);
  CHECK(s.router_histogram.min == want.min);
  CHECK(s.router_histogram.max == want.max);
  CHECK(s.router_histogram.num == want.num);
  CHECK(s.router_histogram.sum == Approx(want.sum).margin(1e-12));
  // Buckets of positions (8 over 12): the routed shares weighted by bucket size add up to C.
  REQUIRE(s.routed_fraction_by_bucket.size() == 8);
  std::vector<double> size(8, 0);
  for (int64_t t = 0; t < 12; ++t) size[t * 8 / 12] += 1;
  double weighted = 0;
  for (int k = 0; k < 8; ++k) weighted += s.routed_fraction_by_bucket[k] * size[k];
  CHECK(weighted == Approx(3.0));
  resolve_stats(stats);  // resolved entries are left alone
  CHECK(stats[0].router_mean == Approx(mean).margin(1e-12));
}

// An f32 out of kSize elements holds half the bytes the f64 summary writes.
TEST_CASE("routing_summary refuses an out it would write past", "[mod]") {
  const Tensor r = Tensor::zeros({2, 8});
  Tensor f32 = Tensor::empty({RoutingSummary::kSize});
  CHECK_THROWS_WITH(backend(Device::CPU).routing_summary(r, r, r, f32),
                    Catch::Contains("out must be f64 [46]"));
  Tensor f64 = Tensor::empty({RoutingSummary::kSize}, DType::F64);
  CHECK_THROWS_WITH(backend(Device::CPU).routing_summary(r, Tensor::zeros({2, 7}), r, f64),
                    Catch::Contains("decision and member must match r [2, 8]"));
}
