// CPU RMSNorm and LayerNorm over rows x [N,D], alone or fused with the residual add before them
// (s = x + a, then the norm of s). Row statistics accumulate in double; forward caches rstd (and
// mean) per row for backward. dweight/dbias are reductions over rows: each thread sums its rows
// into a private [D] slot, then the slots are summed column by column, so there are no atomics
// and the result does not depend on scheduling. The fused and plain kernels share their row
// code, so a fused add + norm gives the add's and the norm's results bit for bit.
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

// --- rows, shared by the plain and the fused kernels ---

// sr = xr + ar: the residual add, with CpuBackend::binary's arithmetic.
template <typename T>
void add_row(const T* xr, const T* ar, int64_t d, T* sr) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) sr[i] = xr[i] + ar[i];
}

// dxr += dsr after the norm's dx was stored: the sum autograd forms when s has two uses (one
// rounding, the same whichever comes first); a separate loop, so it cannot contract into an FMA.
template <typename T>
void add_residual_grad_row(const T* dsr, int64_t d, T* dxr) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) dxr[i] += dsr[i];
}

// yr = xr rstd weight; returns rstd.
template <typename T>
T rmsnorm_row(const T* xr, const T* pw, double eps, int64_t d, T* yr) {
  double ss = 0.0;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
  const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * r * pw[i];
  return r;
}

// yr = (xr - mean) rstd weight + bias; sets mean and rstd.
template <typename T>
void layernorm_row(const T* xr, const T* pw, const T* pb, double eps, int64_t d, T* yr, T& mean,
                   T& rstd) {
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
  mean = m;
  rstd = r;
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) yr[i] = (xr[i] - m) * r * pw[i] + pb[i];
}

// With xhat = x rstd and g = dy weight: dxr = rstd (g - xhat mean(g xhat)); dw += dy xhat.
template <typename T>
void rmsnorm_backward_row(const T* dyr, const T* xr, const T* pw, T r, int64_t d, T* dxr,
                          double* dw) {
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

// With xhat = (x - mean) rstd and g = dy weight: dxr = rstd (g - mean(g) - xhat mean(g xhat));
// dw += dy xhat, db += dy.
template <typename T>
void layernorm_backward_row(const T* dyr, const T* xr, const T* pw, T m, T r, int64_t d, T* dxr,
                            double* dw, double* db) {
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

// --- kernels over rows; a (fused add) null: x is normalised as it is ---

// x, y [N,D] (and a, s [N,D] when fused), weight [D], rstd [N].
void rmsnorm_forward_rows(const char* kernel, const Tensor& x, const Tensor* a, Tensor* s,
                          const Tensor& weight, double eps, Tensor& y, Tensor& rstd) {
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* px = x.data<T>();
    const T* pa = a ? a->data<T>() : nullptr;
    T* ps = s ? s->data<T>() : nullptr;
    const T* pw = weight.data<T>();
    T* py = y.data<T>();
    T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (n * d > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* xr = px + row * d;
      if (pa) {
        add_row(xr, pa + row * d, d, ps + row * d);
        xr = ps + row * d;
      }
      pr[row] = rmsnorm_row(xr, pw, eps, d, py + row * d);
    }
  });
}

// x, y [N,D] (and a, s [N,D] when fused), weight, bias [D], mean, rstd [N].
void layernorm_forward_rows(const char* kernel, const Tensor& x, const Tensor* a, Tensor* s,
                            const Tensor& weight, const Tensor& bias, double eps, Tensor& y,
                            Tensor& mean, Tensor& rstd) {
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* px = x.data<T>();
    const T* pa = a ? a->data<T>() : nullptr;
    T* ps = s ? s->data<T>() : nullptr;
    const T* pw = weight.data<T>();
    const T* pb = bias.data<T>();
    T* py = y.data<T>();
    T* pm = mean.data<T>();
    T* pr = rstd.data<T>();
#pragma omp parallel for schedule(static) if (n * d > kParallelElements)
    for (int64_t row = 0; row < n; ++row) {
      const T* xr = px + row * d;
      if (pa) {
        add_row(xr, pa + row * d, d, ps + row * d);
        xr = ps + row * d;
      }
      layernorm_row(xr, pw, pb, eps, d, py + row * d, pm[row], pr[row]);
    }
  });
}

// dy, x, dx [N,D], weight, dweight [D], rstd [N]; ds [N,D] (undefined: none) is added to dx.
void rmsnorm_backward_rows(const char* kernel, const Tensor& dy, const Tensor& ds,
                           const Tensor& x, const Tensor& weight, const Tensor& rstd, Tensor& dx,
                           Tensor& dweight) {
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* pdy = dy.data<T>();
    const T* pds = ds.defined() ? ds.data<T>() : nullptr;
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
        rmsnorm_backward_row(pdy + row * d, px + row * d, pw, pr[row], d, pdx + row * d, dw);
        if (pds) add_residual_grad_row(pds + row * d, d, pdx + row * d);
      }
      reduce_slots(slots, 0, dweight.data<T>());
    }
  });
}

// dy, x, dx [N,D], weight, dweight, dbias [D], mean, rstd [N]; ds as for RMSNorm.
void layernorm_backward_rows(const char* kernel, const Tensor& dy, const Tensor& ds,
                             const Tensor& x, const Tensor& weight, const Tensor& mean,
                             const Tensor& rstd, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    const int64_t n = x.size(0), d = x.size(1);
    const T* pdy = dy.data<T>();
    const T* pds = ds.defined() ? ds.data<T>() : nullptr;
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
        layernorm_backward_row(pdy + row * d, px + row * d, pw, pm[row], pr[row], d,
                               pdx + row * d, dw, db);
        if (pds) add_residual_grad_row(pds + row * d, d, pdx + row * d);
      }
      reduce_slots(slots, 0, dweight.data<T>());
      reduce_slots(slots, 1, dbias.data<T>());
    }
  });
}

}  // namespace

// x, y [N,D], weight [D], rstd [N] (cached for backward).
void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                 Tensor& rstd) {
  rmsnorm_forward_rows("rmsnorm_forward", x, nullptr, nullptr, weight, eps, y, rstd);
}

// dy, x, dx [N,D], weight, dweight [D], rstd [N].
void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  rmsnorm_backward_rows("rmsnorm_backward", dy, Tensor(), x, weight, rstd, dx, dweight);
}

// x, y [N,D], weight, bias [D], mean and rstd [N] (cached for backward).
void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  layernorm_forward_rows("layernorm_forward", x, nullptr, nullptr, weight, bias, eps, y, mean,
                         rstd);
}

// dy, x, dx [N,D], weight, dweight, dbias [D], mean, rstd [N].
void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight, Tensor& dbias) {
  layernorm_backward_rows("layernorm_backward", dy, Tensor(), x, weight, mean, rstd, dx, dweight,
                          dbias);
}

// x, a, s, y [N,D], weight [D], rstd [N] (cached for backward).
void CpuBackend::add_rmsnorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                     double eps, Tensor& s, Tensor& y, Tensor& rstd) {
  rmsnorm_forward_rows("add_rmsnorm_forward", x, &a, &s, weight, eps, y, rstd);
}

// dy, ds (or undefined), s, dx [N,D], weight, dweight [D], rstd [N].
void CpuBackend::add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                      Tensor& dweight) {
  rmsnorm_backward_rows("add_rmsnorm_backward", dy, ds, s, weight, rstd, dx, dweight);
}

// x, a, s, y [N,D], weight, bias [D], mean and rstd [N] (cached for backward).
void CpuBackend::add_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                       const Tensor& bias, double eps, Tensor& s, Tensor& y,
                                       Tensor& mean, Tensor& rstd) {
  layernorm_forward_rows("add_layernorm_forward", x, &a, &s, weight, bias, eps, y, mean, rstd);
}

// dy, ds (or undefined), s, dx [N,D], weight, dweight, dbias [D], mean, rstd [N].
void CpuBackend::add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                        const Tensor& weight, const Tensor& mean,
                                        const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                        Tensor& dbias) {
  layernorm_backward_rows("add_layernorm_backward", dy, ds, s, weight, mean, rstd, dx, dweight,
                          dbias);
}

}  // namespace mod::cpu
