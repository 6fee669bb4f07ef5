// The f32 exponentials the CPU kernels vectorise (core/cpu/vec_math.h) against libm in double:
// every float on a dense grid of their range, in ulps of the exact result, and their edges.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/cpu/vec_math.h"

namespace {
// |got - want| in units of the f32 spacing at want.
double ulps(float got, double want) {
  const double spacing = std::nextafter(static_cast<float>(want), std::numeric_limits<float>::infinity()) -
                         static_cast<float>(want);
  return std::abs(static_cast<double>(got) - want) / spacing;
}

// The largest ulp error of f against ref over n evenly spaced points of [lo, hi].
template <typename F, typename Ref>
double max_ulps(F f, Ref ref, float lo, float hi, int n) {
  double worst = 0;
  for (int i = 0; i <= n; ++i) {
    const float x = lo + (hi - lo) * static_cast<float>(i) / static_cast<float>(n);
    worst = std::max(worst, ulps(f(x), ref(static_cast<double>(x))));
  }
  return worst;
}
}  // namespace

TEST_CASE("exp_cephes is within 2 ulp of exp and saturates outside its range", "[vec_math]") {
  auto exp_d = [](double x) { return std::exp(x); };
  CHECK(max_ulps(mod::cpu::exp_cephes, exp_d, -87.0f, 88.0f, 2'000'000) <= 2.0);
  CHECK(mod::cpu::exp_cephes(-88.0f) == 0.0f);
  CHECK(mod::cpu::exp_cephes(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(std::isinf(mod::cpu::exp_cephes(89.0f)));
  CHECK(std::isnan(mod::cpu::exp_cephes(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("exp2_bounded is within 2 ulp of exp2 on attention's range and 0 below it",
          "[vec_math]") {
  auto exp2_d = [](double x) { return std::exp2(x); };
  // Scores less their maximum: x <= 0, a little above by rounding; the polynomial's own
  // interval [-0.5, 0.5] densely, then the whole range.
  CHECK(max_ulps(mod::cpu::exp2_bounded, exp2_d, -0.5f, 0.5f, 1'000'000) <= 2.0);
  CHECK(max_ulps(mod::cpu::exp2_bounded, exp2_d, -125.0f, 4.0f, 2'000'000) <= 2.0);
  CHECK(mod::cpu::exp2_bounded(0.0f) == 1.0f);
  CHECK(mod::cpu::exp2_bounded(-1.0f) == 0.5f);
  CHECK(mod::cpu::exp2_bounded(-125.5f) == 0.0f);
  CHECK(mod::cpu::exp2_bounded(-std::numeric_limits<float>::infinity()) == 0.0f);
}
