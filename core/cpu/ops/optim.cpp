// CPU AdamW: one fused pass over param, grad and both moments, in place, per tensor or over a
// list of them (the multi-tensor update's reference: the same pass per slot, so both agree
// bitwise). Bias corrections are computed once on the host in double (adamw_step_constants);
// the per-element math (core/adamw_element.h) runs in the parameter's dtype. And the global-norm
// clip's pieces: the multi-tensor sum of squares and the clip factor.
#include <cmath>

#include "core/adamw_element.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
template <typename T>
AdamWElementConsts<T> element_consts(const AdamWArgs& args, const Tensor& consts,
                                     const Tensor& grad_scale) {
  const double* c = consts.data<double>();
  AdamWElementConsts<T> e;
  e.b1 = static_cast<T>(args.beta1);
  e.b2 = static_cast<T>(args.beta2);
  e.one_b1 = static_cast<T>(1.0 - args.beta1);
  e.one_b2 = static_cast<T>(1.0 - args.beta2);
  e.eps = static_cast<T>(args.eps);
  e.decay = static_cast<T>(c[0]);
  e.step_size = static_cast<T>(c[1]);
  e.rsqrt_bc2 = static_cast<T>(c[2]);
  e.scale = grad_scale.defined() ? grad_scale.data<T>()[0] : T(1);
  return e;
}

// p, g, m, v [n] in place; copy [n] (C) receives the updated p rounded to C, as convert would.
template <typename T, typename C>
void adamw_span(T* p, const T* g, T* m, T* v, C* copy, int64_t n, const AdamWElementConsts<T>& c) {
  const auto sqrt_of = [](T x) { return std::sqrt(x); };
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i], mi = m[i], vi = v[i];
    adamw_element(pi, mi, vi, g[i], c, sqrt_of);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (copy) copy[i] = static_cast<C>(pi);
  }
}
}  // namespace

// param, grad, m, v: same shape. Decoupled weight decay (p *= 1 - lr*wd) precedes the Adam step.
// Each gradient entry is multiplied by grad_scale first, as a separate clipping pass would.
void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamWArgs& args, const Tensor& consts,
                              const Tensor& grad_scale) {
  dispatch_float(param.dtype(), "adamw_update", [&](auto z) {
    using T = decltype(z);
    adamw_span<T, T>(param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), nullptr,
                     param.numel(), element_consts<T>(args, consts, grad_scale));
  });
}

// The CPU reference of the multi-tensor update: adamw_update's pass, slot after slot.
void CpuBackend::adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                                    const Tensor& grad_scale,
                                    const std::vector<MultiTensorEntry>&, Tensor&, bool) {
  for (const AdamWSlot& s : slots) {
    dispatch_float(s.param.dtype(), "adamw_update_multi", [&](auto z) {
      using T = decltype(z);
      const auto c = element_consts<T>(args, s.consts, grad_scale);
      T* p = s.param.data<T>();
      if (!s.copy.defined())
        return adamw_span<T, T>(p, s.grad.data<T>(), s.m.data<T>(), s.v.data<T>(), nullptr,
                                s.param.numel(), c);
      dispatch_float(s.copy.dtype(), "adamw_update_multi", [&](auto y) {
        using C = decltype(y);
        adamw_span<T, C>(p, s.grad.data<T>(), s.m.data<T>(), s.v.data<T>(), s.copy.data<C>(),
                         s.param.numel(), c);
      });
    });
  }
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

// The reference of the multi-tensor norm: each tensor's squares summed in double as
// sum_squares sums them (OpenMP past kParallelElements), then added tensor after tensor.
void CpuBackend::sum_squares_multi(const std::vector<Tensor>& xs,
                                   const std::vector<MultiTensorEntry>&, Tensor&, bool,
                                   Tensor& out) {
  double total = 0.0;
  if (!xs.empty())
    dispatch_float(xs.front().dtype(), "sum_squares_multi", [&](auto z) {
      using T = decltype(z);
      for (const Tensor& x : xs) {
        const T* p = x.data<T>();
        const int64_t n = x.numel();
        double s = 0.0;
#pragma omp parallel for simd reduction(+ : s) if (n > kParallelElements)
        for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
        total += s;
      }
    });
  out.data<double>()[0] = total;
}

}  // namespace mod::cpu
