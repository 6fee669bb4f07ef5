// CPU GEMM: one library call per batch entry (blas.h). Large matrices use the library's own
// threads; many small ones (attention-sized, batched) run one per OpenMP thread, single-threaded.
#include <omp.h>

#include <string>

#include "core/cpu/blas.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
// "gemm NT 2048x768x256" (op(A) [M,K] times op(B) [K,N]), "x8" after it for a batch of 8.
std::string gemm_label(const GemmArgs& g) {
  std::string s = std::string("gemm ") + (g.trans_a ? 'T' : 'N') + (g.trans_b ? 'T' : 'N') + ' ' +
                  std::to_string(g.m) + 'x' + std::to_string(g.n) + 'x' + std::to_string(g.k);
  return g.batch > 1 ? s + " x" + std::to_string(g.batch) : s;
}
}  // namespace

void CpuBackend::gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c) {
  OpTraceScope trace([&] { return gemm_label(g); }, 2.0 * g.batch * g.m * g.n * g.k);
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty sum (an expert no token chose): BLAS refuses lda = k = 0
    if (!g.accumulate) fill(c, 0.0);
    return;
  }
  dispatch_float(c.dtype(), "gemm", [&](auto z) {
    using T = decltype(z);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = c.data<T>();
    const int64_t lda = g.trans_a ? g.m : g.k;
    const int64_t ldb = g.trans_b ? g.k : g.n;
    const T alpha = static_cast<T>(g.alpha), beta = g.accumulate ? T(1) : T(0);
    auto one = [&](int64_t i) {
      blas_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, alpha, pa + i * g.stride_a, lda,
                pb + i * g.stride_b, ldb, beta, pc + i * g.stride_c, g.n);
    };
    // oneDNN and OpenBLAS's OpenMP build run single-threaded inside a parallel region. A
    // batch too small to pay for waking the team (tiny experts, tests) stays on this thread.
    const bool small = g.m * g.n * g.k < (int64_t{1} << 21);
    const bool worth_threads = g.batch * g.m * g.n * g.k >= (int64_t{1} << 16);
    if (g.batch > 1 && small && worth_threads) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < g.batch; ++i) one(i);
    } else {
      for (int64_t i = 0; i < g.batch; ++i) one(i);
    }
  });
}

}  // namespace mod::cpu
