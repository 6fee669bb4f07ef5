// MoD fidelity beyond the invariants of mod_properties_test.cpp, each case aimed at a bug the
// invariant tests would let through: the residual added inside Block::delta, per-sequence BCE
// targets that pass by luck, the sigmoid gate, AUX_BCE decoding, sampling without a causal
// decision, routing scores coarsened by autocast, and generation's last wasted decode step.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "tests/support/grad_check.h"
#include "tests/support/tiny_configs.h"
#include "tests/reference/naive_ops.h"

using mod::test::arange_positions;
using mod::test::max_diff;

using namespace mod;
using namespace mod::model;

namespace {
using modtrain::CausalRoutingConfig;

std::vector<double> values(const Tensor& t) {
  return t.to_vector();
}

std::vector<int64_t> positions(const Tensor& pos) {
  std::vector<int64_t> p;
  for (double v : pos.to_vector()) p.push_back(static_cast<int64_t>(v));
  return p;
}

}  // namespace

TEST_CASE("Block::delta against its weights: zero output projections give exactly x", "[mod]") {
  auto cfg = test::tiny_model(true);
  Rng rng(51);
  Block block(cfg, /*routed=*/true, rng, DType::F64);
  for (const char* name : {"attn.wo.weight", "mlp.down.weight"}) {
    Tensor w = block.parameter(name);
    w.copy_from(Tensor::zeros(w.shape(), DType::F64));
  }
  const Tensor x = randn({2, 12, 16}, rng, DType::F64), pos = arange_positions(2, 12);
  const auto f = values(block.delta(x, pos));
  CHECK(*std::max_element(f.begin(), f.end()) == 0.0);
  CHECK(*std::min_element(f.begin(), f.end()) == 0.0);
  // Routed: the chosen tokens get x + r * 0, the others x: the output is x, bit for bit.
  const auto routed = route_top_c(block, x, pos, 3, modtrain::RouterConfig::IDENTITY);
  CHECK(values(routed.out) == values(x));
}

// delta = a + mlp(norm2(x + a)), a = wo . attention(rope(wq . n), rope(wk . n), wv . n),
// n = norm1(x): written out here with the naive reference ops, not the model's code. update,
// the dense path's x + delta with one add fewer, gives x + a + m.
TEST_CASE("Block::delta and Block::update equal a block computed independently from its weights",
          "[mod]") {
  auto cfg = test::tiny_model(false);
  Rng rng(52);
  Block block(cfg, /*routed=*/false, rng, DType::F64);
  const int64_t b = 2, t = 5, d = 16, h = 2, dh = 8, ff = 32;
  const Tensor x = randn({b, t, d}, rng, DType::F64), pos = arange_positions(b, t);
  auto w = [&](const char* name) { return values(block.parameter(name)); };
  namespace ref = reference;
  const auto xv = values(x);
  const auto p = positions(pos);
  const auto n1 = ref::rmsnorm(xv, w("norm1.weight"), b * t, d, cfg.norm_eps());
  const auto q = ref::rope(ref::matmul_nt(n1, w("attn.wq.weight"), b * t, d, d), p, b, t, h, dh,
                           cfg.rope_theta());
  const auto k = ref::rope(ref::matmul_nt(n1, w("attn.wk.weight"), b * t, d, d), p, b, t, h, dh,
                           cfg.rope_theta());
  const auto v = ref::matmul_nt(n1, w("attn.wv.weight"), b * t, d, d);
  const auto a = ref::matmul_nt(ref::attention(q, k, v, p, p, b, t, t, h, dh), w("attn.wo.weight"),
                                b * t, d, d);
  std::vector<double> xa(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) xa[i] = xv[i] + a[i];
  auto up = ref::matmul_nt(ref::rmsnorm(xa, w("norm2.weight"), b * t, d, cfg.norm_eps()),
                           w("mlp.up.weight"), b * t, ff, d);
  for (double& u : up) u = ref::gelu(u);
  const auto m = ref::matmul_nt(up, w("mlp.down.weight"), b * t, d, ff);

  const auto got = values(block.delta(x, pos));
  REQUIRE(got.size() == a.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - (a[i] + m[i])));
  CHECK(worst < 1e-12);
  const auto updated = values(block.update(x, pos));
  REQUIRE(updated.size() == a.size());
  worst = 0;
  for (size_t i = 0; i < updated.size(); ++i)
    worst = std::max(worst, std::abs(updated[i] - (xv[i] + a[i] + m[i])));
  CHECK(worst < 1e-12);
}

// A batch-level top-2C would give the pair different targets than each sequence alone only when
// the batch's 2C best scores do not split C/C; the inputs are chosen so that they do not.
TEST_CASE("causal-routing BCE targets are per sequence, on a batch where batch-level top-k differs",
          "[mod]") {
  const int64_t t = 12, c = 3;
  for (auto method : {CausalRoutingConfig::PREDICTOR, CausalRoutingConfig::AUX_BCE}) {
    auto cfg = test::tiny_model(true);
    cfg.mutable_mod()->mutable_causal()->set_method(method);
    Transformer m(cfg, 8, DType::F64);
    NoGradGuard g;
    Tensor both;
    int64_t first_row_share = c;
    for (uint64_t seed = 1; seed < 200 && first_row_share == c; ++seed) {
      both = test::tokens_for(2, t, 32, seed);
      const auto r = values(m.forward(both, both).stats.at(0).r);  // [2,12]
      std::vector<std::pair<double, int64_t>> all;
      for (int64_t i = 0; i < 2 * t; ++i) all.push_back({-r[i], i});
      std::sort(all.begin(), all.end());
      first_row_share = 0;
      for (int64_t k = 0; k < 2 * c; ++k) first_row_share += all[k].second < t;
    }
    INFO("method " << method << ": batch-level top-2C takes " << first_row_share
                   << " tokens of the first sequence");
    REQUIRE(first_row_share != c);

    auto result = m.forward(both, both);
    const auto member = values(result.stats.at(0).member);
    for (int64_t row = 0; row < 2; ++row) {
      double routed = 0;
      for (int64_t i = 0; i < t; ++i) routed += member[row * t + i];
      CHECK(routed == c);
    }
    const double pair = result.aux_loss.item();
    const double alone = 0.5 * (m.forward(both.narrow0(0, 1), both.narrow0(0, 1)).aux_loss.item() +
                                m.forward(both.narrow0(1, 1), both.narrow0(1, 1)).aux_loss.item());
    CHECK(pair == Approx(alone).epsilon(1e-12));
  }
}

TEST_CASE("the sigmoid gate: x + sigmoid(r) * f, with finite-difference-checked gradients",
          "[mod][grad]") {
  auto cfg = test::tiny_model(true);
  Rng rng(53);
  auto block = std::make_shared<Block>(cfg, true, rng, DType::F64);
  const Tensor pos = arange_positions(2, 8);
  const Tensor x = randn({2, 8, 16}, rng, DType::F64);
  const auto out = route_top_c(*block, x, pos, 3, modtrain::RouterConfig::SIGMOID);
  const Tensor f = block->delta(gather_rows(x, out.idx), out.idx);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t k = 0; k < 3; ++k) {
      const int64_t i = static_cast<int64_t>(out.idx.at(s * 3 + k));
      const double g = 1.0 / (1.0 + std::exp(-out.r.at(s * 8 + i)));
      for (int64_t e = 0; e < 16; ++e)
        CHECK(out.out.at((s * 8 + i) * 16 + e) ==
              Approx(x.at((s * 8 + i) * 16 + e) + g * f.at((s * 3 + k) * 16 + e)).margin(1e-12));
    }

  test::GradCase gc{
      "MoD block, sigmoid gate [2,8,16] C=3", Op::GatherRows,
      [&](Rng& r) {
        return std::vector<Tensor>{randn({2, 8, 16}, r, DType::F64).set_requires_grad(true),
                                   block->parameter("router.proj.weight"),
                                   block->parameter("attn.wq.weight")};
      },
      [&](const std::vector<Tensor>& in) {
        return route_top_c(*block, in[0], pos, 3, modtrain::RouterConfig::SIGMOID).out;
      }};
  const auto report = test::check_gradients(gc, 13);
  INFO(report.worst << " (" << report.worst_error << ")");
  CHECK(report.ok);
}

TEST_CASE("AUX_BCE on a plain MoD model: decoding with KV caches equals the causal forward",
          "[mod]") {
  auto cfg = test::tiny_model(true);
  cfg.mutable_mod()->mutable_causal()->set_method(CausalRoutingConfig::AUX_BCE);
  Transformer m(cfg, 14, DType::F64);
  REQUIRE(m.num_blocks() == 2);
  const Tensor tok = test::tokens_for(1, 12, 32, 43);
  NoGradGuard g;
  const Tensor full = m.forward(tok, Tensor(), RoutingMode::Causal).logits;  // [1,12,32]
  auto caches = m.make_caches(12);
  for (int64_t t = 0; t < 12; ++t) {
    const Tensor step = m.decode_step(static_cast<int64_t>(tok.at(t)), t, caches);
    for (int64_t v = 0; v < 32; ++v) CHECK(step.at(v) == Approx(full.at(t * 32 + v)).margin(1e-10));
  }
  // The router's own sign decides: some tokens in, some out.
  CHECK(caches[1].size() > 0);
  CHECK(caches[1].size() < 12);
}

TEST_CASE("causal.method NONE: sampling and causal evaluation are refused, naming the field",
          "[mod]") {
  auto cfg = test::tiny_model(true);
  cfg.mutable_mod()->mutable_causal()->set_method(CausalRoutingConfig::NONE);
  Transformer m(cfg, 15, DType::F64);
  const Tensor tok = test::tokens_for(1, 12, 32, 44);
  NoGradGuard g;
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(m.forward(tok, Tensor(), RoutingMode::Causal),
                    Contains("model.mod.causal.method is NONE"));
  CHECK_THROWS_WITH(m.make_caches(12), Contains("model.mod.causal.method is NONE"));
  CHECK_THROWS_WITH(generate(m, {1, 2}, 4, SamplingParams{}), Contains("PREDICTOR or AUX_BCE"));
  CHECK_NOTHROW(m.forward(tok, tok));  // training-time top-C routing is unaffected
}

// The routing scores' precision under a narrower autocast, shown with the dtypes the CPU has:
// f64 masters under AutocastGuard(F32) stand for f32 masters under bf16. Scores 1 + i * 1e-9
// are distinct in f64 and all equal to 1 in f32, where top-C would take the first C positions.
TEST_CASE("router and predictor scores keep the masters' precision under a narrower autocast",
          "[mod][autocast]") {
  const int64_t t = 8, c = 3;
  Rng rng(54);
  Router router(2, /*bias=*/false, rng, 0.1, DType::F64);
  Tensor w = router.parameter("proj.weight");
  w.copy_from(Tensor::from_vector({1.0, 1e-9}, {1, 2}, DType::F64));
  std::vector<double> xs;
  for (int64_t i = 0; i < t; ++i) xs.insert(xs.end(), {1.0, static_cast<double>(i)});
  const Tensor x = Tensor::from_vector(xs, {1, t, 2}, DType::F32);  // the residual stream's dtype

  AutocastGuard narrow(DType::F32);
  const Tensor r = router.scores(x);
  CHECK(r.dtype() == DType::F64);
  const Tensor idx = topk_rows(r, c);
  CHECK(values(idx) == std::vector<double>{5, 6, 7});  // the last three: highest scores
  // The gate that scales the block's output comes back in the compute dtype.
  CHECK(apply_gate(modtrain::RouterConfig::IDENTITY, r).dtype() == DType::F32);

  Predictor predictor(2, 4, rng, 0.5, DType::F64);
  CHECK(predictor.logits(x).dtype() == DType::F64);
}

TEST_CASE("generation stops at model.seq_len without feeding the last token", "[mod]") {
  auto cfg = test::tiny_model(true);
  Transformer m(cfg, 16, DType::F64);
  SamplingParams params;
  params.temperature = 0;
  const auto g = generate(m, {3, 4}, 100, params);
  CHECK(g.tokens.size() == 10);  // 12 positions, 2 taken by the prompt
  REQUIRE(g.seen.size() == 1);
  CHECK(g.seen[0] == 11);  // positions 0..10 fed; the token at 11 is only sampled
  CHECK(g.admitted[0] <= 11);
}

TEST_CASE("resolved routing statistics carry a histogram of every router score", "[mod]") {
  Transformer m(test::tiny_model(true), 18, DType::F64);
  const Tensor tokens = test::tokens_for(2, 12, 32, 45);
  auto stats = m.forward(tokens, tokens).stats;
  REQUIRE(stats.size() == 1);
  const auto r = values(stats[0].r);
  resolve_stats(stats);
  const auto& h = stats[0].router_histogram;
  CHECK(h.num == 24);
  CHECK(h.min == *std::min_element(r.begin(), r.end()));
  CHECK(h.max == *std::max_element(r.begin(), r.end()));
  double total = 0;
  for (double c : h.count) total += c;
  CHECK(total == 24);
}
