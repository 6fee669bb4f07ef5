// The GEMM backend picks its kernel from the CPU, not from OPENBLAS_CORETYPE. The hidden test
// runs as its own CTest entry with OPENBLAS_CORETYPE=Haswell set (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>
#include <string>

#include "core/cpu/blas.h"

using Catch::Matchers::Contains;

TEST_CASE("the GEMM backend reports its kernel", "[blas]") {
  const std::string d = mod::cpu::blas_describe();
  INFO(d);
  CHECK_THAT(d, Contains("OpenBLAS") && Contains("kernel"));
}

TEST_CASE("OPENBLAS_CORETYPE from the environment is ignored", "[.blas_env]") {
  REQUIRE(std::getenv("OPENBLAS_CORETYPE") != nullptr);  // set by the CTest entry
  const std::string d = mod::cpu::blas_describe();
  INFO(d);
  CHECK_THAT(d, Contains("ignored OPENBLAS_CORETYPE"));
  CHECK(std::getenv("OPENBLAS_CORETYPE") == nullptr);
  // On an AVX-512 CPU the forced Haswell kernel would run at half speed.
  if (__builtin_cpu_supports("avx512f")) CHECK_THAT(d, !Contains("kernel Haswell"));
}

// beta = 0 must overwrite C without reading it (blas_gemm zeroes C itself and accumulates):
// NaN and infinity left in C, and in the padding past N of each row, must not leak.
TEST_CASE("blas_gemm with beta 0 overwrites C, leaving row padding alone", "[blas]") {
  const int64_t m = 37, n = 19, k = 23, ldc = n + 3;
  std::vector<float> a(m * k), b(k * n), c(m * ldc, std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  for (int64_t i = 0; i < k * n; ++i) b[i] = static_cast<float>((i * 5) % 13) - 6.0f;
  for (int64_t i = 0; i < m; ++i) c[i * ldc + 1] = std::numeric_limits<float>::infinity();
  mod::cpu::blas_gemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), ldc);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;  // small integers: exact in float
      for (int64_t p = 0; p < k; ++p) want += double(a[i * k + p]) * b[p * n + j];
      REQUIRE(c[i * ldc + j] == static_cast<float>(want));
    }
    for (int64_t j = n; j < ldc; ++j) REQUIRE(std::isnan(c[i * ldc + j]));
  }
}
