// CPU sigmoid binary cross-entropy with logits, elementwise. The forward uses the form that never
// exponentiates a positive number, so it is finite for any finite logit.
#include <algorithm>
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

// logits, targets, losses: same shape; losses = max(x,0) - x*t + log(1 + exp(-|x|))
void CpuBackend::bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                                         Tensor& losses) {
  dispatch_float(logits.dtype(), "bce_with_logits_forward", [&](auto z) {
    using T = decltype(z);
    const T* x = logits.data<T>();
    const T* t = targets.data<T>();
    T* out = losses.data<T>();
    const int64_t n = logits.numel();
    // exp/log1p are scalar libm calls here (no -ffast-math), so parallelise earlier.
#pragma omp parallel for schedule(static) if (n > kParallelElements / 8)
    for (int64_t i = 0; i < n; ++i)
      out[i] = std::max(x[i], T(0)) - x[i] * t[i] + std::log1p(std::exp(-std::abs(x[i])));
  });
}

// dlogits = grad_scale * (sigmoid(x) - t); 1/(1+exp(-x)) is exact enough at both tails
// (exp(-x) overflowing to inf gives 0, not NaN).
void CpuBackend::bce_with_logits_backward(const Tensor& logits, const Tensor& targets,
                                          double grad_scale, Tensor& dlogits) {
  dispatch_float(logits.dtype(), "bce_with_logits_backward", [&](auto z) {
    using T = decltype(z);
    const T* x = logits.data<T>();
    const T* t = targets.data<T>();
    T* dx = dlogits.data<T>();
    const T s = static_cast<T>(grad_scale);
    const int64_t n = logits.numel();
#pragma omp parallel for schedule(static) if (n > kParallelElements / 8)
    for (int64_t i = 0; i < n; ++i) dx[i] = s * (T(1) / (T(1) + std::exp(-x[i])) - t[i]);
  });
}

}  // namespace mod::cpu
