// CUDA AdamW: one fused in-place pass over param, grad and both moments, the arithmetic of
// core/cpu/ops/optim.cpp step for step. The step's constants (decay, bias-corrected step size)
// are computed on the host in double and read from a device tensor, so a captured step (CUDA
// graph) uses the current step's; the per-element math runs in Acc<T> (so a bf16 model keeps
// f32 constants and rounds only when storing p, m and v). And the global-norm clip factor.
// Work split: one grid-stride loop over the flat index (coalesced, any n); each element is read
// and written by one thread, so in-place updates need no synchronisation.
#include <cmath>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

// Run-invariant constants, built on the host like the CPU's; the per-step ones come from
// `step` = {1 - lr * weight_decay, lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step)} (f64).
template <typename A>
struct AdamWParams {
  A b1, b2;               // beta1, beta2
  A one_b1, one_b2;       // 1 - beta1, 1 - beta2
  A eps;
  const double* step;
};

// param, grad, m, v [n], in place, with g = grad * *scale (1 when scale is null):
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = (1 - lr wd) p - step_size m / (sqrt(v) rsqrt_bc2 + eps)
template <typename T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamWParams<Acc<T>> c,
                             const T* scale) {
  using A = Acc<T>;
  const A decay = static_cast<A>(c.step[0]), step_size = static_cast<A>(c.step[1]),
          rsqrt_bc2 = static_cast<A>(c.step[2]);
  const A s = scale ? load(scale) : A(1);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const A gi = load(g + i) * s;
    const A mi = c.b1 * load(m + i) + c.one_b1 * gi;
    const A vi = c.b2 * load(v + i) + c.one_b2 * gi * gi;
    m[i] = from_acc<T>(mi);
    v[i] = from_acc<T>(vi);
    p[i] = from_acc<T>(decay * load(p + i) - step_size * mi / (acc_sqrt(vi) * rsqrt_bc2 + c.eps));
  }
}
}  // namespace

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                               const AdamWArgs& args, const Tensor& consts,
                               const Tensor& grad_scale) {
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "adamw_update", [&](auto z) {
    using T = decltype(z);
    using A = Acc<T>;
    AdamWParams<A> c;
    c.b1 = static_cast<A>(args.beta1);
    c.b2 = static_cast<A>(args.beta2);
    c.one_b1 = static_cast<A>(1.0 - args.beta1);
    c.one_b2 = static_cast<A>(1.0 - args.beta2);
    c.eps = static_cast<A>(args.eps);
    c.step = consts.data<double>();
    adamw_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), n, c,
        grad_scale.defined() ? grad_scale.data<T>() : nullptr);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

namespace {
template <typename T>
__global__ void clip_factor_kernel(const double* sq, double max_norm, double* norm, T* factor) {
  const double n = sqrt(sq[0]);
  *norm = n;
  *factor = from_acc<T>(static_cast<Acc<T>>(max_norm > 0 && n > max_norm ? max_norm / (n + 1e-6) : 1.0));
}
}  // namespace

void CudaBackend::clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) {
  dispatch_float(factor.dtype(), "clip_factor", [&](auto z) {
    using T = decltype(z);
    clip_factor_kernel<<<1, 1, 0, compute_stream()>>>(sq.data<double>(), max_norm,
                                                      norm.data<double>(), factor.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
