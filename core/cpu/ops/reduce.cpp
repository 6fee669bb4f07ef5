// CPU reductions. Float inputs accumulate in double so a sum over millions of f32 elements
// loses no more than one rounding.
#include <omp.h>

#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

void CpuBackend::sum_all(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_all", [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    const int64_t n = x.numel();
    double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) total += static_cast<double>(p[i]);
    out.data<T>()[0] = static_cast<T>(total);
  });
}

void CpuBackend::sum_squares(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_squares", [&](auto z) {
    using T = decltype(z);
    const T* p = x.data<T>();
    const int64_t n = x.numel();
    double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(p[i]);
      total += v * v;
    }
    out.data<T>()[0] = static_cast<T>(total);
  });
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
