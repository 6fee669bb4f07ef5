// The GEMM backend picks its kernel from the CPU, not from OPENBLAS_CORETYPE. The hidden test
// runs as its own CTest entry with OPENBLAS_CORETYPE=Haswell set (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cstdlib>
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
