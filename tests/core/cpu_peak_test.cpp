// The CPU's stated peak, MFU's denominator: a product of what the processor reports, above any
// rate a GEMM reaches, and overridable by a checked environment variable.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "core/cpu/blas.h"
#include "core/cpu/cpu_peak.h"

using namespace mod;

TEST_CASE("the stated CPU peak is cores x FLOP/cycle x clock", "[cpu_peak]") {
  const cpu::CpuPeak p = cpu::cpu_peak();
  REQUIRE_FALSE(p.overridden);
  CHECK(p.cores >= 1);
  CHECK((p.flops_per_cycle == 8 || p.flops_per_cycle == 16 || p.flops_per_cycle == 32 ||
         p.flops_per_cycle == 64));
  CHECK(p.ghz > 0.5);
  CHECK(p.ghz < 7);
  CHECK(p.flops() == Approx(p.cores * p.flops_per_cycle * p.ghz * 1e9));
  CHECK_THAT(p.describe(), Catch::Contains("FLOP/cycle") && Catch::Contains("GHz"));
  // Unbound ranks on one host share it: four of them get at most a quarter of its cores each.
  CHECK(cpu::cpu_peak(4).cores <= std::max(1, p.cores));
}

// The property MFU needs: no SGEMM this process runs beats the stated peak (a short timed SGEMM
// as the denominator let a 3-step run print MFU 120%).
TEST_CASE("no SGEMM beats the stated CPU peak", "[cpu_peak]") {
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::blas_gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double sgemm = 2.0 * n * n * n / best;
  INFO("SGEMM " << sgemm / 1e9 << " GFLOP/s, stated peak " << cpu::cpu_peak().describe());
  CHECK(sgemm <= cpu::cpu_peak().flops());
}

TEST_CASE("MOD_CPU_PEAK_GFLOPS overrides the stated peak, a bad value names the variable",
          "[cpu_peak]") {
  setenv("MOD_CPU_PEAK_GFLOPS", "123.5", 1);
  const cpu::CpuPeak p = cpu::cpu_peak();
  CHECK(p.overridden);
  CHECK(p.flops() == Approx(123.5e9));
  setenv("MOD_CPU_PEAK_GFLOPS", "fast", 1);
  CHECK_THROWS_WITH(cpu::cpu_peak(), Catch::Contains("MOD_CPU_PEAK_GFLOPS") && Catch::Contains("fast"));
  setenv("MOD_CPU_PEAK_GFLOPS", "-3", 1);
  CHECK_THROWS_WITH(cpu::cpu_peak(), Catch::Contains("positive"));
  unsetenv("MOD_CPU_PEAK_GFLOPS");
}
