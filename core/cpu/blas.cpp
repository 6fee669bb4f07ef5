// GEMM dispatch (see blas.h): tiny products in our loops, f32 to oneDNN or OpenBLAS, f64 to
// OpenBLAS, which is loaded here after clearing OPENBLAS_CORETYPE.
#include "core/cpu/blas.h"

#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/cpu/transpose.h"

#ifdef MOD_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#endif

#ifndef MOD_OPENBLAS_PATH
#define MOD_OPENBLAS_PATH "libopenblas.so.0"
#endif

namespace mod::cpu {

namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS enum values

using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                         int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int,
                         const double*, int, double, double*, int);
using CharFn = char* (*)();
using IntFn = int (*)();

struct Blas {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  std::string description;
};

void* open_library() {
  const char* candidates[] = {MOD_OPENBLAS_PATH, "libopenblas.so.0", "libopenblas.so"};
  std::string errors;
  for (const char* path : candidates) {
    if (void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) return h;
    errors += std::string("\n  ") + dlerror();
  }
  throw std::runtime_error("cannot load OpenBLAS (install libopenblas0-openmp):" + errors);
}

const Blas& blas() {
  static Blas instance;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string note;
    if (const char* forced = std::getenv("MOD_OPENBLAS_CORETYPE")) {
      setenv("OPENBLAS_CORETYPE", forced, 1);
      note = std::string(", forced by MOD_OPENBLAS_CORETYPE=") + forced;
    } else if (const char* env = std::getenv("OPENBLAS_CORETYPE")) {
      note = std::string(", ignored OPENBLAS_CORETYPE=") + env;
      unsetenv("OPENBLAS_CORETYPE");
    }
    void* h = open_library();
    instance.sgemm = reinterpret_cast<SgemmFn>(dlsym(h, "cblas_sgemm"));
    instance.dgemm = reinterpret_cast<DgemmFn>(dlsym(h, "cblas_dgemm"));
    if (!instance.sgemm || !instance.dgemm)
      throw std::runtime_error("OpenBLAS library lacks cblas_sgemm/cblas_dgemm");
    auto corename = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_corename"));
    auto config = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_config"));
    auto threads = reinterpret_cast<IntFn>(dlsym(h, "openblas_get_num_threads"));
    instance.description = std::string(config ? config() : "OpenBLAS ?") + ", kernel " +
                           (corename ? corename() : "?") + ", " +
                           std::to_string(threads ? threads() : 0) + " threads" + note;
  });
  return instance;
}

int to_int(int64_t v, const char* what) {
  if (v > INT32_MAX) throw std::invalid_argument(std::string("gemm: ") + what + " exceeds 2^31");
  return static_cast<int>(v);
}

// One-row (m = 1) and one-column (n = 1) products, as in decoding one token, run here: the
// BLAS packs the whole other matrix on every GEMM call, and its threaded GEMV pays a thread
// wake-up per call, more than a small product costs (docs/performance.md, "Sampling"). These
// loops are memory-bound dot products and row updates, threaded only when the matrix is large.
constexpr int64_t kParallelMatrix = int64_t{1} << 18;

// c[j] = beta c[j] + alpha sum_k x[k inc] w(k, j), where w(k, j) = w[j*ldw + k] when w_rows_are_j
// (w stored [J,K]) and w[k*ldw + j] otherwise (w stored [K,J]); c has stride ldc.
template <typename T>
void vector_times_matrix(bool w_rows_are_j, int64_t jn, int64_t kn, T alpha, const T* x,
                         int64_t inc, const T* w, int64_t ldw, T beta, T* c, int64_t ldc) {
  const bool parallel = jn * kn > kParallelMatrix;
  if (w_rows_are_j) {
#pragma omp parallel for if (parallel)
    for (int64_t j = 0; j < jn; ++j) {
      const T* row = w + j * ldw;
      T acc = 0;
      if (inc == 1) {  // the common case; a strided x would make every load a gather
#pragma omp simd reduction(+ : acc)
        for (int64_t k = 0; k < kn; ++k) acc += x[k] * row[k];
      } else {
        for (int64_t k = 0; k < kn; ++k) acc += x[k * inc] * row[k];
      }
      c[j * ldc] = alpha * acc + (beta == T(0) ? T(0) : beta * c[j * ldc]);
    }
    return;
  }
  // w stored [K,J]: each thread owns a slice of columns and streams every row through it.
#pragma omp parallel if (parallel)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = jn * t / nt, hi = jn * (t + 1) / nt;
    for (int64_t j = lo; j < hi; ++j) c[j * ldc] = beta == T(0) ? T(0) : beta * c[j * ldc];
    for (int64_t k = 0; k < kn; ++k) {
      const T xk = alpha * x[k * inc];
      const T* row = w + k * ldw;
      if (ldc == 1) {
#pragma omp simd
        for (int64_t j = lo; j < hi; ++j) c[j] += xk * row[j];
      } else {
        for (int64_t j = lo; j < hi; ++j) c[j * ldc] += xk * row[j];
      }
    }
  }
}

// c[M,N] (row stride ldc) = 0, rows split across threads when the block is large.
template <typename T>
void zero_rows(int64_t m, int64_t n, T* c, int64_t ldc) {
#pragma omp parallel for if (m * n > kParallelMatrix)
  for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, sizeof(T) * n);
}

// One-row and one-column products skip the libraries (see vector_times_matrix); true when done.
template <typename T>
bool vector_product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                    int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 1) {  // c[1,N] = op(a)[1,K] op(b)[K,N]; a's K values are lda apart when ta
    vector_times_matrix(tb, n, k, alpha, a, ta ? lda : 1, b, ldb, beta, c, 1);
    return true;
  }
  if (n == 1) {  // c[M,1] = op(a)[M,K] op(b)[K,1], i.e. c^T = op(b)^T op(a)^T
    vector_times_matrix(!ta, m, k, alpha, b, tb ? 1 : ldb, a, lda, beta, c, ldc);
    return true;
  }
  return false;
}

template <typename T, typename Gemm>
void openblas_gemm(Gemm gemm, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
                   const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  // OpenBLAS applies beta = 0 in a pass of its own before the product, with scalar stores on
  // some kernels (a few percent of a training step: docs/performance.md); zeroing here at
  // memset speed and accumulating with beta = 1 gives the same result.
  if (beta == T(0)) {
    zero_rows(m, n, c, ldc);
    beta = T(1);
  }
  gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, to_int(m, "M"), to_int(n, "N"),
       to_int(k, "K"), alpha, a, to_int(lda, "lda"), b, to_int(ldb, "ldb"), beta, c,
       to_int(ldc, "ldc"));
}

constexpr bool kHaveOneDnn =
#ifdef MOD_HAVE_ONEDNN
    true;
#else
    false;
#endif

SgemmLibrary library_from_environment() {
  const char* env = std::getenv("MOD_SGEMM");
  if (!env || !*env) return kHaveOneDnn ? SgemmLibrary::OneDnn : SgemmLibrary::OpenBlas;
  const std::string v = env;
  if (v == "openblas") return SgemmLibrary::OpenBlas;
  if (v == "onednn" && kHaveOneDnn) return SgemmLibrary::OneDnn;
  throw std::invalid_argument("MOD_SGEMM=" + v + ": expected openblas" +
                              (kHaveOneDnn ? " or onednn"
                                           : " (this build has no oneDNN: install libdnnl-dev "
                                             "and configure again)"));
}

std::atomic<SgemmLibrary>& current_library() {
  static std::atomic<SgemmLibrary> library{library_from_environment()};
  return library;
}

#ifdef MOD_HAVE_ONEDNN
void onednn_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda,
                                          b, ldb, beta, c, ldc);
  if (status != dnnl_success)
    throw std::runtime_error("oneDNN sgemm " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                             std::to_string(k) + " failed: " + dnnl_status2str(status));
}

// oneDNN's ISA as it names it, without the prefix: "avx2", "avx512_core_amx".
std::string onednn_isa() {
  std::string isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());  // "cpu_isa_avx2"
  if (isa.rfind("cpu_isa_", 0) == 0) isa.erase(0, 8);
  return isa;
}

// Whether oneDNN runs its AVX2 kernels, which the routing below keeps from some shapes; its
// AVX-512 sgemm beat OpenBLAS on every shape tried (docs/blas.md) and runs everything.
bool onednn_runs_avx2() {
  static const bool avx2 = [] {
    const std::string isa = onednn_isa();
    return isa.find("avx512") == std::string::npos && isa.find("amx") == std::string::npos;
  }();
  return avx2;
}

// oneDNN 2.6's AVX2 sgemm is slower than OpenBLAS on Zen 3 at 2 threads for these products, which
// go to OpenBLAS (docs/blas.md, "The weight-gradient layout", "The input gradient of a routed
// block"):
// - A^T B, the weight gradient dY^T X: half rate once a side of C reaches 512, slower at
//   256x256 too;
// - A B, the input gradient dY W, with few rows (M <= 512: the tokens a routed block admits) and
//   both other sides >= 512; with M <= 256, once N >= 1024 whatever K (the tiny model's routed
//   MLP).
bool onednn_is_slow(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  if (!onednn_runs_avx2()) return false;
  if (ta && !tb) return true;
  return !ta && !tb && ((m <= 512 && n >= 512 && k >= 512) || (m <= 256 && n >= 1024));
}

// Its AVX-512 sgemm runs A B^T (a linear layer's x W^T) with few output columns, N <= 512, and
// K >= N well below its A B rate, so those products run as A B on a transposed copy of B; with
// N >= 768, or K < N, the copy does not pay (docs/blas.md, "The forward product of a narrow
// linear layer").
bool onednn_wants_b_transposed(bool ta, bool tb, int64_t n, int64_t k) {
  return !onednn_runs_avx2() && !ta && tb && n <= 512 && k >= n;
}

// B^T is copied by both threads from 32K floats: from a 256 x 256 weight up, two copy it faster
// than one (docs/performance.md).
constexpr int64_t kParallelTranspose = int64_t{1} << 15;

// C = alpha A B^T + beta C as A (B^T) with B^T copied out: B [n, k] (ldb) -> [k, n].
void onednn_sgemm_b_transposed(int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                               int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                               int64_t ldc) {
  thread_local std::vector<float> bt;
  if (bt.size() < static_cast<size_t>(n * k)) bt.resize(static_cast<size_t>(n * k));
  transpose_matrix(b, ldb, n, k, bt.data(), n, /*parallel=*/n * k >= kParallelTranspose);
  onednn_sgemm(false, false, m, n, k, alpha, a, lda, bt.data(), n, beta, c, ldc);
}

// The weight gradient dY^T X (A^T B) of a narrow C (N < M) over many tokens. oneDNN's A^T B
// kernel runs it slower than the same product with the sides swapped, and it splits C between
// its threads, so each packs the whole of one operand. Each thread instead computes C^T = B^T A
// over its slice of K, single-threaded, and the partials are summed and transposed into C. Not
// for a C under 256K floats (slower there) nor over 4M (the partials' memory); the bits depend on
// the thread count, as oneDNN's own split's do (docs/blas.md, "The weight gradient of a narrow
// layer", has the timings). Returns the slices, 1 for oneDNN's own split.
int onednn_k_slices(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  if (onednn_runs_avx2() || !ta || tb || n >= m || omp_in_parallel()) return 1;
  const int threads = omp_get_max_threads();
  const int64_t c_size = m * n;
  if (threads < 2 || k / threads < 512 || c_size < (int64_t{1} << 18) ||
      c_size > (int64_t{1} << 22))
    return 1;
  return threads;
}

// C = alpha A^T B + beta C (A [k, m], B [k, n]) as (sum over slices of K of alpha B^T A)^T.
void onednn_sgemm_k_split(int slices, int64_t m, int64_t n, int64_t k, float alpha,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                          float* c, int64_t ldc) {
  const int64_t size = n * m;  // each partial is C^T [n, m]
  thread_local std::vector<float> partials;
  if (partials.size() < static_cast<size_t>(slices * size))
    partials.resize(static_cast<size_t>(slices * size));
  float* part = partials.data();
#pragma omp parallel num_threads(slices)
  {
#pragma omp for schedule(static, 1)
    for (int s = 0; s < slices; ++s) {
      const int64_t k0 = k * s / slices, kn = k * (s + 1) / slices - k0;
      onednn_sgemm(true, false, n, m, kn, alpha, b + k0 * ldb, ldb, a + k0 * lda, lda, 0.0f,
                   part + s * size, m);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < size; i += 1024)
      for (int s = 1; s < slices; ++s)
        for (int64_t j = i; j < std::min(size, i + 1024); ++j) part[j] += part[s * size + j];
  }
  transpose_matrix_add(part, m, n, m, beta, c, ldc, /*parallel=*/true);
}

std::string onednn_describe() {
  const dnnl_version_t* v = dnnl_version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + onednn_isa() + ")";
}
#endif
}  // namespace

namespace {
enum class SgemmPath { OwnLoop, OneDnn, OneDnnBTransposed, OneDnnKSplit, OpenBlas };

// One decision for blas_gemm and sgemm_path, so what the tests see is what runs.
SgemmPath sgemm_route([[maybe_unused]] bool ta, [[maybe_unused]] bool tb, int64_t m, int64_t n,
                      [[maybe_unused]] int64_t k) {  // unused in a build without oneDNN
  if (m == 1 || n == 1) return SgemmPath::OwnLoop;
#ifdef MOD_HAVE_ONEDNN
  if (current_library().load(std::memory_order_relaxed) == SgemmLibrary::OneDnn &&
      !onednn_is_slow(ta, tb, m, n, k)) {
    if (onednn_wants_b_transposed(ta, tb, n, k)) return SgemmPath::OneDnnBTransposed;
    if (onednn_k_slices(ta, tb, m, n, k) > 1) return SgemmPath::OneDnnKSplit;
    return SgemmPath::OneDnn;
  }
#endif
  return SgemmPath::OpenBlas;
}
}  // namespace

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  switch (sgemm_route(ta, tb, m, n, k)) {
    case SgemmPath::OwnLoop:
      vector_product(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
#ifdef MOD_HAVE_ONEDNN
    case SgemmPath::OneDnn:
      return onednn_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case SgemmPath::OneDnnBTransposed:
      return onednn_sgemm_b_transposed(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    case SgemmPath::OneDnnKSplit:
      return onednn_sgemm_k_split(onednn_k_slices(ta, tb, m, n, k), m, n, k, alpha, a, lda, b,
                                  ldb, beta, c, ldc);
#endif
    default:
      return openblas_gemm(blas().sgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

std::string sgemm_path(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  switch (sgemm_route(ta, tb, m, n, k)) {
    case SgemmPath::OwnLoop: return "own loop";
    case SgemmPath::OneDnn: return "oneDNN";
    case SgemmPath::OneDnnBTransposed: return "oneDNN, B transposed first";
    case SgemmPath::OneDnnKSplit: return "oneDNN, K split between the threads";
    case SgemmPath::OpenBlas: return "OpenBLAS";
  }
  // No default above: a new path is a -Wswitch warning here, not a test told "OpenBLAS".
  throw std::logic_error("sgemm_path: unknown SgemmPath");
}

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (vector_product(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
  openblas_gemm(blas().dgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

SgemmLibrary sgemm_library() { return current_library().load(); }

void set_sgemm_library(SgemmLibrary library) {
  if (library == SgemmLibrary::OneDnn && !kHaveOneDnn)
    throw std::invalid_argument("set_sgemm_library: this build has no oneDNN (libdnnl-dev)");
  current_library().store(library);
}

std::string blas_describe() {
#ifdef MOD_HAVE_ONEDNN
  if (sgemm_library() == SgemmLibrary::OneDnn) {
    return "f32 " + onednn_describe() +
           (onednn_runs_avx2()
                ? " (in OpenBLAS: A^T B; A B with M <= 512, N and K >= 512, or M <= 256, N >= 1024)"
                : " (A B^T with N <= 512 and K >= N: as A B on a transposed B; A^T B with N < M, "
                  "C of 256K-4M floats, 512 or more tokens a thread: K split between the "
                  "threads)") +
           "; f64 " +
           blas().description;
  }
#endif
  return "f32 and f64 " + blas().description;
}

}  // namespace mod::cpu
