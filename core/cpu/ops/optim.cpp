// CPU AdamW: one fused pass over param, grad and both moments, in place. Bias corrections are
// computed once on the host in double (adamw_step_constants); the per-element math runs in the
// parameter's dtype. And the global-norm clip factor.
#include <cmath>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

// param, grad, m, v: same shape. Decoupled weight decay (p *= 1 - lr*wd) precedes the Adam step.
// Each gradient entry is multiplied by grad_scale first, as a separate clipping pass would.
void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWArgs& args, const Tensor& consts,
                              const Tensor& grad_scale) {
  const double* c = consts.data<double>();
  dispatch_float(param.dtype(), "adamw_update", [&](auto z) {
    using T = decltype(z);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    const T decay = static_cast<T>(c[0]);
    const T b1 = static_cast<T>(args.beta1), b2 = static_cast<T>(args.beta2);
    const T one_b1 = static_cast<T>(1.0 - args.beta1), one_b2 = static_cast<T>(1.0 - args.beta2);
    // p -= lr * (m / bc1) / (sqrt(v / bc2) + eps), with the two corrections folded in.
    const T step_size = static_cast<T>(c[1]);
    const T rsqrt_bc2 = static_cast<T>(c[2]);
    const T eps = static_cast<T>(args.eps);
    const T scale = grad_scale.defined() ? grad_scale.data<T>()[0] : T(1);
    const int64_t n = param.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
    for (int64_t i = 0; i < n; ++i) {
      const T gi = g[i] * scale;  // exact when scale is 1
      const T mi = b1 * pm[i] + one_b1 * gi;
      const T vi = b2 * pv[i] + one_b2 * gi * gi;
      pm[i] = mi;
      pv[i] = vi;
      p[i] = decay * p[i] - step_size * mi / (std::sqrt(vi) * rsqrt_bc2 + eps);
    }
  });
}

void CpuBackend::clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) {
  const double n = std::sqrt(sq.data<double>()[0]);
  norm.data<double>()[0] = n;
  const double f = max_norm > 0 && n > max_norm ? max_norm / (n + 1e-6) : 1.0;
  dispatch_float(factor.dtype(), "clip_factor", [&](auto z) {
    using T = decltype(z);
    factor.data<T>()[0] = static_cast<T>(f);
  });
}

}  // namespace mod::cpu
