// OpenBLAS loader: resolves cblas_sgemm/dgemm after clearing OPENBLAS_CORETYPE (see blas.h).
#include "core/cpu/blas.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>

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
using SgemvFn = void (*)(int, int, int, int, float, const float*, int, const float*, int, float,
                         float*, int);
using DgemvFn = void (*)(int, int, int, int, double, const double*, int, const double*, int,
                         double, double*, int);
using CharFn = char* (*)();
using IntFn = int (*)();

struct Blas {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  SgemvFn sgemv = nullptr;
  DgemvFn dgemv = nullptr;
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
    instance.sgemv = reinterpret_cast<SgemvFn>(dlsym(h, "cblas_sgemv"));
    instance.dgemv = reinterpret_cast<DgemvFn>(dlsym(h, "cblas_dgemv"));
    if (!instance.sgemm || !instance.dgemm || !instance.sgemv || !instance.dgemv)
      throw std::runtime_error("OpenBLAS library lacks cblas_sgemm/dgemm/sgemv/dgemv");
    auto corename = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_corename"));
    auto config = reinterpret_cast<CharFn>(dlsym(h, "openblas_get_config"));
    auto threads = reinterpret_cast<IntFn>(dlsym(h, "openblas_get_num_threads"));
    instance.description = std::string("OpenBLAS ") + (config ? config() : "?") + ", kernel " +
                           (corename ? corename() : "?") + ", " +
                           std::to_string(threads ? threads() : 0) + " threads" + note;
  });
  return instance;
}

int to_int(int64_t v, const char* what) {
  if (v > INT32_MAX) throw std::invalid_argument(std::string("gemm: ") + what + " exceeds 2^31");
  return static_cast<int>(v);
}

// One-row (m = 1) and one-column (n = 1) products go to GEMV: OpenBLAS's GEMM packs the whole
// other matrix on every call, which makes decoding one token 5-9x slower than GEMV.
template <typename T, typename Gemm, typename Gemv>
void gemm_or_gemv(Gemm gemm, Gemv gemv, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha,
                  const T* a, int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m == 1) {  // c[1,N] = op(a)[1,K] op(b)[K,N], i.e. c^T = op(b)^T a^T
    const int inc_a = ta ? to_int(lda, "lda") : 1;
    if (tb)  // b stored [N,K]
      gemv(kRowMajor, kNoTrans, to_int(n, "N"), to_int(k, "K"), alpha, b, to_int(ldb, "ldb"), a,
           inc_a, beta, c, 1);
    else  // b stored [K,N]
      gemv(kRowMajor, kTrans, to_int(k, "K"), to_int(n, "N"), alpha, b, to_int(ldb, "ldb"), a,
           inc_a, beta, c, 1);
    return;
  }
  if (n == 1) {  // c[M,1] = op(a)[M,K] op(b)[K,1]
    const int inc_b = tb ? 1 : to_int(ldb, "ldb");
    if (ta)  // a stored [K,M]
      gemv(kRowMajor, kTrans, to_int(k, "K"), to_int(m, "M"), alpha, a, to_int(lda, "lda"), b,
           inc_b, beta, c, to_int(ldc, "ldc"));
    else
      gemv(kRowMajor, kNoTrans, to_int(m, "M"), to_int(k, "K"), alpha, a, to_int(lda, "lda"), b,
           inc_b, beta, c, to_int(ldc, "ldc"));
    return;
  }
  gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, to_int(m, "M"), to_int(n, "N"),
       to_int(k, "K"), alpha, a, to_int(lda, "lda"), b, to_int(ldb, "ldb"), beta, c,
       to_int(ldc, "ldc"));
}
}  // namespace

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_or_gemv(blas().sgemm, blas().sgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
               int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_or_gemv(blas().dgemm, blas().dgemv, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

std::string blas_describe() { return blas().description; }

}  // namespace mod::cpu
