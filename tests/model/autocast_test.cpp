// Mixed precision's plumbing, checked on the CPU with f64 standing in for bf16: f32 master
// weights under AutocastGuard(F64) compute the whole model in f64. The casts f32 -> f64 are
// exact, so the loss must equal, bitwise, an f64 model holding the same weights, and each f32
// gradient must be exactly that model's f64 gradient rounded to f32 (the cast's backward), except
// the embedding table's, which sums several casts' gradients in f32 (to f32 rounding).
// Any layer that forgets to autocast fails with a dtype mismatch, any that casts twice or
// drops the gradient fails the comparison. (bf16 itself runs on the GPU: tests/cuda.)
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/transformer.h"
#include "tests/support/tiny_configs.h"

namespace mod {
namespace {

void check_autocast_matches_f64(const modtrain::ModelConfig& cfg) {
  model::Transformer master(cfg, 3, DType::F32), wide(cfg, 3, DType::F64);
  const auto mp = master.named_parameters(), wp = wide.named_parameters();
  REQUIRE(mp.size() == wp.size());
  for (size_t i = 0; i < mp.size(); ++i) {
    Tensor w = wp[i].second;  // shares the parameter's storage
    w.copy_from(mp[i].second.to(DType::F64));
  }

  std::vector<int64_t> ids(2 * 12), next(2 * 12);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int64_t>((i * 7 + 3) % 32);
    next[i] = static_cast<int64_t>((i * 5 + 1) % 32);
  }
  const Tensor tokens = Tensor::from_indices(ids, {2, 12}), targets = Tensor::from_indices(next, {2, 12});

  model::ForwardResult a;
  {
    AutocastGuard f64(DType::F64);
    a = master.forward(tokens, targets);
  }
  CHECK(a.logits.dtype() == DType::F64);
  a.loss.backward();
  model::ForwardResult b = wide.forward(tokens, targets);
  b.loss.backward();
  CHECK(a.loss.item() == b.loss.item());
  for (size_t i = 0; i < mp.size(); ++i) {
    INFO(mp[i].first);
    const Tensor& g = mp[i].second.grad();
    REQUIRE(g.defined());
    CHECK(g.dtype() == DType::F32);
    const Tensor want = wp[i].second.grad().to(DType::F32);
    if (mp[i].first != "embed.weight") {
      CHECK(g.to_vector() == want.to_vector());
      continue;
    }
    // The table's gradient arrives through several casts (each repeated token, and the tied
    // head), each rounded to f32 and summed in f32, where the f64 model sums first and rounds
    // once: equal to f32 rounding of the sum, not bitwise.
    double worst = 0, scale = 0;
    for (int64_t j = 0; j < g.numel(); ++j) {
      worst = std::max(worst, std::abs(g.at(j) - want.at(j)));
      scale = std::max(scale, std::abs(want.at(j)));
    }
    CHECK(worst <= 4e-7 * scale);
  }
}
}  // namespace

TEST_CASE("autocast: f32 masters computing in f64 match an f64 model exactly", "[autocast]") {
  SECTION("dense") { check_autocast_matches_f64(test::tiny_model(false)); }
  SECTION("MoD with the predictor") { check_autocast_matches_f64(test::tiny_model(true)); }
  SECTION("MoD with the router's BCE") {
    auto cfg = test::tiny_model(true);
    cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::AUX_BCE);
    check_autocast_matches_f64(cfg);
  }
  SECTION("staged MoDE") { check_autocast_matches_f64(test::tiny_moe(true)); }
  SECTION("integrated MoDE") { check_autocast_matches_f64(test::tiny_moe(false, true)); }
}

TEST_CASE("cast: values convert, the gradient comes back in the source dtype", "[autocast]") {
  const Tensor x = Tensor::from_vector({1.5, -2.25, 3.0}, {3}, DType::F32).set_requires_grad(true);
  const Tensor y = cast(x, DType::F64);
  CHECK(y.dtype() == DType::F64);
  CHECK(y.to_vector() == std::vector<double>{1.5, -2.25, 3.0});
  sum(mul(y, y)).backward();
  CHECK(x.grad().dtype() == DType::F32);
  CHECK(x.grad().to_vector() == std::vector<double>{3.0, -4.5, 6.0});
  CHECK(loss_precision(x).same(x));  // only bf16 is widened for losses
  CHECK_THROWS_WITH(cast(Tensor::from_indices({1}, {1}), DType::F32), Catch::Contains("cast"));
}

}  // namespace mod
