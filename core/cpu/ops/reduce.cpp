// CPU reductions. Float inputs accumulate in double so a sum over millions of f32 elements
// loses no more than one rounding.
#include <omp.h>

#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
// out[0] = the sum of term(x_i) over x, accumulated in double.
template <typename Term>
void sum_terms(const char* kernel, const Tensor& x, Tensor& out, Term term) {
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    const int64_t n = x.numel();
    double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) total += term(static_cast<double>(p[i]));
    out.data<T>()[0] = static_cast<T>(total);
  });
}
}  // namespace

void CpuBackend::sum_all(const Tensor& x, Tensor& out) {
  sum_terms("sum_all", x, out, [](double v) { return v; });
}

void CpuBackend::sum_squares(const Tensor& x, Tensor& out) {
  sum_terms("sum_squares", x, out, [](double v) { return v * v; });
}

void CpuBackend::sum_outer(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_outer", [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    T* po = out.data<T>();
    // Each thread owns a slice of columns and walks every row: no shared accumulators.
#pragma omp parallel if (outer * inner > kParallelElements)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t lo = inner * t / nt, hi = inner * (t + 1) / nt;
      std::vector<double> acc(static_cast<size_t>(hi - lo), 0.0);
      for (int64_t o = 0; o < outer; ++o) {
        const T* row = p + o * inner;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) acc[i - lo] += row[i];
      }
      for (int64_t i = lo; i < hi; ++i) po[i] = static_cast<T>(acc[i - lo]);
    }
  });
}

void CpuBackend::sum_inner(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_inner", [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    T* po = out.data<T>();
#pragma omp parallel for if (outer * inner > kParallelElements)
    for (int64_t o = 0; o < outer; ++o) {
      const T* row = p + o * inner;
      double acc = 0.0;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < inner; ++i) acc += row[i];
      po[o] = static_cast<T>(acc);
    }
  });
}

}  // namespace mod::cpu
