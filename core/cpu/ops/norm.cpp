// CPU RMSNorm and LayerNorm over rows x [N,D]. Row statistics accumulate in double; forward
// caches rstd (and mean) per row for backward. dweight/dbias are reductions over rows: each
// thread sums its rows into a private [D] slot, then the slots are summed column by column, so
// there are no atomics and the result does not depend on scheduling.
#include <omp.h>

#include <cmath>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {

// Per-thread [D] accumulators for `count` parameter gradients: acc [threads, count, D].
struct ParamGradSlots {
  int threads, count;
  int64_t d;
  std::vector<double> acc;
  ParamGradSlots(bool parallel, int count_, int64_t d_)
      : threads(parallel ? omp_get_max_threads() : 1),
        count(count_),
        d(d_),
        acc(static_cast<size_t>(threads) * count_ * d_, 0.0) {}
  double* slot(int thread, int which) {
    return acc.data() + (static_cast<int64_t>(thread) * count + which) * d;
  }
};

// out [D] = sum over threads of slot(t, which). Call inside the parallel region after the row
// loop's barrier: threads split the columns.
template <typename T>
void reduce_slots(ParamGradSlots& s, int which, T* out) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < s.d; ++i) {
    double total = 0.0;
    for (int t = 0; t < s.threads; ++t) total += s.slot(t, which)[i];
    out[i] = static_cast<T>(total);
  }
}

}  // namespace

// x, y [N,D], weight [D], rstd [N] (cached for backward).
void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                 Tensor& rstd) {
  dispatch_float(x.dtype(), "rmsnorm_forward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    T* py = y.data<T>();
    T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (n * d > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* xr = px + row * d;
      T* yr = py + row * d;
      double ss = 0.0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
      const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      pr[row] = r;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * r * pw[i];
    }
  });
}

// dy, x, dx [N,D], weight, dweight [D], rstd [N]. With xhat = x rstd and g = dy weight:
// dx = rstd (g - xhat mean(g xhat)), dweight = sum over rows of dy xhat.
void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  dispatch_float(x.dtype(), "rmsnorm_backward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    const T* pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    const bool parallel = n * d > kParallelElements;
    ParamGradSlots slots(parallel, 1, d);
#pragma omp parallel num_threads(slots.threads) if (parallel)
    {
      double* dw = slots.slot(omp_get_thread_num(), 0);
#pragma omp for schedule(static)
      for (int64_t row = 0; row < n; ++row) {
        const T* xr = px + row * d;
        const T* dyr = pdy + row * d;
        T* dxr = pdx + row * d;
        const T r = pr[row];
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(dyr[i] * pw[i]) * (xr[i] * r);
        const T c = static_cast<T>(dot / static_cast<double>(d));
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
          const T xhat = xr[i] * r;
          dxr[i] = r * (dyr[i] * pw[i] - xhat * c);
          dw[i] += static_cast<double>(dyr[i] * xhat);
        }
      }
      reduce_slots(slots, 0, dweight.data<T>());
    }
  });
}

// x, y [N,D], weight, bias [D], mean and rstd [N] (cached for backward).
void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  dispatch_float(x.dtype(), "layernorm_forward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    const T* pb = bias.data<T>();
    T* py = y.data<T>();
    T* pm = mean.data<T>();
    T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (n * d > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* xr = px + row * d;
      T* yr = py + row * d;
      double s = 0.0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < d; ++i) s += static_cast<double>(xr[i]);
      const double mu = s / static_cast<double>(d);
      // Second pass over the (cached) row: sum of squared deviations does not cancel.
      double ss = 0.0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < d; ++i) {
        const double dev = static_cast<double>(xr[i]) - mu;
        ss += dev * dev;
      }
      const T m = static_cast<T>(mu);
      const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
      pm[row] = m;
      pr[row] = r;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * r * pw[i] + pb[i];
    }
  });
}

// dy, x, dx [N,D], weight, dweight, dbias [D], mean, rstd [N]. With xhat = (x - mean) rstd and
// g = dy weight: dx = rstd (g - mean(g) - xhat mean(g xhat)); dweight = sum dy xhat; dbias =
// sum dy (sums over rows).
void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias) {
  dispatch_float(x.dtype(), "layernorm_backward", [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* pdy = dy.data<T>();
    const T* px = x.data<T>();
    const T* pw = weight.data<T>();
    const T* pm = mean.data<T>();
    const T* pr = rstd.data<T>();
    T* pdx = dx.data<T>();
    const bool parallel = n * d > kParallelElements;
    ParamGradSlots slots(parallel, 2, d);
#pragma omp parallel num_threads(slots.threads) if (parallel)
    {
      double* dw = slots.slot(omp_get_thread_num(), 0);
      double* db = slots.slot(omp_get_thread_num(), 1);
#pragma omp for schedule(static)
      for (int64_t row = 0; row < n; ++row) {
        const T* xr = px + row * d;
        const T* dyr = pdy + row * d;
        T* dxr = pdx + row * d;
        const T m = pm[row], r = pr[row];
        double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t i = 0; i < d; ++i) {
          const double g = static_cast<double>(dyr[i] * pw[i]);
          sum_g += g;
          sum_gx += g * ((xr[i] - m) * r);
        }
        const T c_g = static_cast<T>(sum_g / static_cast<double>(d));
        const T c_gx = static_cast<T>(sum_gx / static_cast<double>(d));
#pragma omp simd
        for (int64_t i = 0; i < d; ++i) {
          const T xhat = (xr[i] - m) * r;
          dxr[i] = r * (dyr[i] * pw[i] - c_g - xhat * c_gx);
          dw[i] += static_cast<double>(dyr[i] * xhat);
          db[i] += static_cast<double>(dyr[i]);
        }
      }
      reduce_slots(slots, 0, dweight.data<T>());
      reduce_slots(slots, 1, dbias.data<T>());
    }
  });
}

}  // namespace mod::cpu
