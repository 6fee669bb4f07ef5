// The GEMM backend: both f32 libraries against a double reference, beta = 0 never reading C,
// run-to-run determinism, and library selection. OpenBLAS picks its kernel from the CPU, not
// from OPENBLAS_CORETYPE; that hidden test, and the one for a bad MOD_SGEMM, run as their own
// CTest entries with the variable set (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "core/backend.h"
#include "core/cpu/blas.h"
#include "core/tensor.h"

using Catch::Matchers::Contains;
using mod::cpu::SgemmLibrary;

namespace {
// The f32 libraries this build has, each made current in turn; the original is restored after.
std::vector<SgemmLibrary> built_libraries() {
  const SgemmLibrary was = mod::cpu::sgemm_library();
  std::vector<SgemmLibrary> libs{SgemmLibrary::OpenBlas};
  try {
    mod::cpu::set_sgemm_library(SgemmLibrary::OneDnn);
    libs.push_back(SgemmLibrary::OneDnn);
  } catch (const std::invalid_argument& e) {
    WARN("f32 GEMM tests cover OpenBLAS only: " << e.what());
  }
  mod::cpu::set_sgemm_library(was);
  return libs;
}

const char* name(SgemmLibrary lib) { return lib == SgemmLibrary::OneDnn ? "oneDNN" : "OpenBLAS"; }

struct RestoreLibrary {
  SgemmLibrary was = mod::cpu::sgemm_library();
  ~RestoreLibrary() { mod::cpu::set_sgemm_library(was); }
};

// oneDNN as the f32 library for a scope (the original restored after), and whether its kernels
// are the AVX2 ones, against which the routing to OpenBLAS was measured.
struct WithOneDnn {
  RestoreLibrary restore;
  bool avx2 = false;
  WithOneDnn() {
    mod::cpu::set_sgemm_library(SgemmLibrary::OneDnn);
    avx2 = mod::cpu::blas_describe().find("(avx2)") != std::string::npos;
  }
};
}  // namespace

TEST_CASE("the GEMM backend reports its libraries, oneDNN for f32 where built in", "[blas]") {
  const std::string d = mod::cpu::blas_describe();
  INFO(d);
  CHECK_THAT(d, Contains("OpenBLAS") && Contains("kernel"));
  if (built_libraries().size() == 2) {  // MOD_SGEMM unset in this entry: oneDNN by default
    CHECK(mod::cpu::sgemm_library() == SgemmLibrary::OneDnn);
    CHECK_THAT(d, Contains("f32 oneDNN"));
  }
  RestoreLibrary restore;
  mod::cpu::set_sgemm_library(SgemmLibrary::OpenBlas);
  CHECK_THAT(mod::cpu::blas_describe(), Contains("f32 and f64 OpenBLAS"));
}

TEST_CASE("a bad MOD_SGEMM names the variable and the choices", "[.blas_env]") {
  REQUIRE(std::getenv("MOD_SGEMM") != nullptr);  // set by the CTest entry
  try {
    mod::cpu::sgemm_library();
    FAIL("MOD_SGEMM=" << std::getenv("MOD_SGEMM") << " was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(std::string(e.what()), Contains("MOD_SGEMM=mkl") && Contains("expected openblas"));
  }
}

namespace {
struct Shape { int64_t m, n, k; };

// blas_gemm of one layout and shape, with padded leading dimensions, alpha and beta != 0,
// against double sums; the row padding of C must be left alone.
void check_against_double(bool ta, bool tb, Shape s) {
  const int64_t lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 2, ldc = s.n + 5;
  const int64_t a_rows = ta ? s.k : s.m, b_rows = tb ? s.n : s.k;
  std::vector<float> a(a_rows * lda), b(b_rows * ldb), c(s.m * ldc);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.23 * i);
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::sin(0.11 * i);
  const std::vector<float> c0 = c;
  mod::cpu::blas_gemm(ta, tb, s.m, s.n, s.k, 0.75f, a.data(), lda, b.data(), ldb, -0.5f, c.data(),
                      ldc);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double want = 0;
      for (int64_t p = 0; p < s.k; ++p)
        want += double(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      want = 0.75 * want - 0.5 * c0[i * ldc + j];
      REQUIRE(std::abs(c[i * ldc + j] - want) <= 1e-5 * (1 + std::abs(want)) * std::sqrt(s.k));
    }
    for (int64_t j = s.n; j < ldc; ++j) REQUIRE(c[i * ldc + j] == c0[i * ldc + j]);
  }
}

// Sets the OpenMP thread count for a scope (the K split follows it).
struct Threads {
  int was = omp_get_max_threads();
  explicit Threads(int n) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(was); }
};
}  // namespace

// Every transpose, padded leading dimensions, alpha and beta != 0, shapes past each library's
// blocking (and the one-row and one-column products that bypass both), against double sums.
// With oneDNN's AVX-512 kernels, A B^T at 130x257x300, 520x40x70 and 96x300x1000 runs on a
// transposed copy of B (the last two copied by both threads).
TEST_CASE("f32 GEMM in each library matches a double reference", "[blas]") {
  RestoreLibrary restore;
  for (const SgemmLibrary lib : built_libraries()) {
    mod::cpu::set_sgemm_library(lib);
    for (const Shape s : {Shape{67, 45, 33}, Shape{130, 257, 300}, Shape{520, 40, 70},
                          Shape{96, 300, 1000}, Shape{1, 40, 70}, Shape{50, 1, 70}})
      for (const bool ta : {false, true})
        for (const bool tb : {false, true}) {
          INFO(name(lib) << " " << s.m << "x" << s.n << "x" << s.k << " ta " << ta << " tb " << tb);
          check_against_double(ta, tb, s);
        }
  }
}

// With oneDNN's AVX-512 kernels, A^T B over many tokens is split along K between the threads
// (blas.cpp): uneven slices (3 threads) and ragged edges for the 8x8 blocks of the transposing
// sum.
TEST_CASE("A^T B split along K matches a double reference, at 2 and 3 threads", "[blas]") {
  RestoreLibrary restore;
  if (built_libraries().size() < 2) return;  // no oneDNN
  mod::cpu::set_sgemm_library(SgemmLibrary::OneDnn);
  for (const int threads : {2, 3}) {
    Threads set(threads);
    for (const Shape s : {Shape{1040, 260, 1024 * threads / 2}, Shape{1030, 300, 1600}}) {
      INFO(threads << " threads, " << s.m << "x" << s.n << "x" << s.k << ": "
                   << mod::cpu::sgemm_path(true, false, s.m, s.n, s.k));
      check_against_double(true, false, s);
    }
  }
}

// Resume and the parallel-layout tests compare runs bitwise: the same product twice must give
// the same bits (OpenMP threads as configured).
TEST_CASE("f32 GEMM gives the same bits on every call", "[blas]") {
  RestoreLibrary restore;
  const int64_t m = 512, n = 384, k = 1024;
  std::vector<float> a(m * k), b(k * n), c1(m * n), c2(m * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37 * i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.23 * i);
  for (const SgemmLibrary lib : built_libraries()) {
    mod::cpu::set_sgemm_library(lib);
    for (const bool ta : {false, true}) {
      INFO(name(lib) << " ta " << ta);
      mod::cpu::blas_gemm(ta, false, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), n, 0.0f,
                          c1.data(), n);
      for (int rep = 0; rep < 3; ++rep) {
        mod::cpu::blas_gemm(ta, false, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), n, 0.0f,
                            c2.data(), n);
        REQUIRE(c1 == c2);
      }
    }
  }
}

// Where oneDNN 2.6's AVX2 sgemm is slow (blas.cpp: every A^T B, and A B with few rows), with
// oneDNN current those products run in OpenBLAS (sgemm_path is blas_gemm's own decision; on
// AVX-512 CPUs the two libraries can round these sums alike, so results cannot tell them apart).
TEST_CASE("with oneDNN current, the layouts and shapes where it is slow run in OpenBLAS", "[blas]") {
  if (built_libraries().size() < 2) return;  // no oneDNN: nothing to route
  const WithOneDnn onednn;
  auto in_openblas = [&](bool ta, int64_t m, int64_t n, int64_t k) {
    return mod::cpu::sgemm_path(ta, false, m, n, k) == "OpenBLAS";
  };
  // The rules were measured against oneDNN's AVX2 sgemm; its AVX-512 one runs everything.
  const bool avx2 = onednn.avx2;
  INFO(mod::cpu::blas_describe());
  // The weight gradient dY^T X.
  CHECK(in_openblas(true, 512, 96, 777) == avx2);
  CHECK(in_openblas(true, 256, 96, 777) == avx2);
  // The input gradient dY W of a routed block: few rows, both other sides >= 512.
  CHECK(in_openblas(false, 256, 512, 1024) == avx2);
  CHECK(in_openblas(false, 512, 512, 512) == avx2);
  CHECK_FALSE(in_openblas(false, 1024, 512, 1024));  // a whole batch's rows
  CHECK_FALSE(in_openblas(false, 256, 256, 1024));
  CHECK_FALSE(in_openblas(false, 256, 512, 256));
  // ... and with at most 256 rows, a wide output whatever K (the tiny model's routed MLP).
  CHECK(in_openblas(false, 256, 1024, 256) == avx2);
  CHECK(in_openblas(false, 64, 2048, 128) == avx2);
  CHECK_FALSE(in_openblas(false, 512, 1024, 256));
  if (avx2)
    CHECK_THAT(mod::cpu::blas_describe(),
               Contains("(in OpenBLAS: A^T B; A B with M <= 512, N and K >= 512, or M <= 256, N >= 1024)"));
  else
    CHECK_THAT(mod::cpu::blas_describe(), !Contains("in OpenBLAS:"));
}

// oneDNN's AVX-512 sgemm runs x W^T with few output columns at 60-80% of its x W rate
// (blas.cpp): those products run on a transposed copy of W. The reference test above checks what
// they compute; this one which products take that path.
TEST_CASE("with oneDNN's AVX-512 kernels, A B^T with N <= 512 and K >= N runs on a transposed B",
          "[blas]") {
  if (built_libraries().size() < 2) return;  // no oneDNN
  const WithOneDnn onednn;
  const bool avx2 = onednn.avx2;
  INFO(mod::cpu::blas_describe());
  const std::string transposed = avx2 ? "oneDNN" : "oneDNN, B transposed first";
  using mod::cpu::sgemm_path;
  CHECK(sgemm_path(false, true, 2048, 512, 2048) == transposed);  // an MLP's down projection
  CHECK(sgemm_path(false, true, 256, 256, 1024) == transposed);   // ... in a routed block
  CHECK(sgemm_path(false, true, 2048, 512, 512) == transposed);   // K = N
  CHECK(sgemm_path(false, true, 2048, 513, 2048) == "oneDNN");    // N over 512
  CHECK(sgemm_path(false, true, 2048, 512, 511) == "oneDNN");     // K under N
  CHECK(sgemm_path(false, false, 2048, 512, 2048) == "oneDNN");
  CHECK(sgemm_path(true, true, 2048, 512, 2048) == "oneDNN");
  CHECK(sgemm_path(false, true, 1, 512, 2048) == "own loop");
  CHECK((mod::cpu::blas_describe().find("as A B on a transposed B") != std::string::npos) == !avx2);
  mod::cpu::set_sgemm_library(SgemmLibrary::OpenBlas);
  CHECK(sgemm_path(false, true, 2048, 512, 2048) == "OpenBLAS");
}

// ... and A^T B, the weight gradient dY^T X, with a narrow C (N < M) over many tokens splits K
// between the threads rather than C, each computing C^T over its slice.
TEST_CASE("with oneDNN's AVX-512 kernels, a narrow A^T B over 512 tokens a thread splits K",
          "[blas]") {
  if (built_libraries().size() < 2) return;  // no oneDNN
  const WithOneDnn onednn;
  const bool avx2 = onednn.avx2;
  INFO(mod::cpu::blas_describe());
  const std::string split = avx2 ? "OpenBLAS" : "oneDNN, K split between the threads";
  const std::string whole = avx2 ? "OpenBLAS" : "oneDNN";
  using mod::cpu::sgemm_path;
  Threads two(2);
  CHECK(sgemm_path(true, false, 1024, 256, 2048) == split);  // tiny's up projection
  CHECK(sgemm_path(true, false, 8192, 512, 1024) == split);  // an output layer, 4M floats of C
  CHECK(sgemm_path(true, false, 256, 1024, 2048) == whole);  // a wide C: its kernel is fast
  CHECK(sgemm_path(true, false, 1024, 1024, 2048) == whole);
  CHECK(sgemm_path(true, false, 8192, 513, 2048) == whole);  // over 4M floats: partials too big
  CHECK(sgemm_path(true, false, 1024, 256, 1023) == whole);  // under 512 tokens a thread
  CHECK(sgemm_path(true, false, 1023, 256, 2048) == whole);  // C under 256K floats
  CHECK(sgemm_path(false, false, 1024, 256, 2048) == "oneDNN");
  CHECK(sgemm_path(true, true, 1024, 256, 2048) == "oneDNN");
  {
    Threads one(1);
    CHECK(sgemm_path(true, false, 1024, 256, 2048) == whole);
  }
  {
    Threads three(3);
    CHECK(sgemm_path(true, false, 1024, 256, 1536) == split);
    CHECK(sgemm_path(true, false, 1024, 256, 1535) == whole);
  }
  CHECK((mod::cpu::blas_describe().find("K split between the threads") != std::string::npos) ==
        !avx2);
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

// beta = 0 must overwrite C without reading it (for OpenBLAS blas_gemm zeroes C itself and
// accumulates): NaN and infinity left in C, and in the padding past N of each row, must not leak.
TEST_CASE("blas_gemm with beta 0 overwrites C, leaving row padding alone", "[blas]") {
  RestoreLibrary restore;
  for (const SgemmLibrary lib : built_libraries()) {
    mod::cpu::set_sgemm_library(lib);
    INFO(name(lib));
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
}

// An empty sum (an expert no token chose, in backward): BLAS refuses lda = k = 0, so the backend
// writes C = 0 itself, or leaves C when accumulating, as the CUDA backend does. Found when the
// CUDA suite first ran (under the emulator) against a oneDNN build's CPU reference.
TEST_CASE("the CPU backend's gemm with k = 0 writes zeros, or keeps C when accumulating",
          "[blas]") {
  RestoreLibrary restore;
  mod::Backend& be = mod::backend(mod::Device::CPU);
  for (const SgemmLibrary lib : built_libraries()) {
    mod::cpu::set_sgemm_library(lib);
    INFO(name(lib));
    mod::GemmArgs g;
    g.batch = 2;
    g.m = 5;
    g.n = 6;
    g.k = 0;
    g.stride_c = 30;
    const mod::Tensor a = mod::Tensor::zeros({0}), b = mod::Tensor::zeros({0});
    mod::Tensor c = mod::Tensor::full({60}, 7.0);
    be.gemm(g, a, b, c);
    CHECK(c.to_vector() == std::vector<double>(60, 0.0));
    g.accumulate = true;
    c = mod::Tensor::full({60}, 7.0);
    be.gemm(g, a, b, c);
    CHECK(c.to_vector() == std::vector<double>(60, 7.0));
  }
}
