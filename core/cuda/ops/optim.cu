// CUDA AdamW: one fused in-place pass over param, grad and both moments, the arithmetic of
// core/cpu/ops/optim.cpp step for step. Bias corrections are computed once on the host in
// double and folded into two constants; the per-element math runs in Acc<T> (so a bf16 model
// keeps f32 constants and rounds only when storing p, m and v).
// Work split: one grid-stride loop over the flat index (coalesced, any n); each element is read
// and written by one thread, so in-place updates need no synchronisation.
#include <cmath>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {
__device__ __forceinline__ float sqrt_acc(float x) { return sqrtf(x); }  // IEEE-rounded (-prec-sqrt)
__device__ __forceinline__ double sqrt_acc(double x) { return sqrt(x); }

// Launch-invariant constants, built on the host like the CPU's.
template <typename A>
struct AdamWParams {
  A decay;                // 1 - lr * weight_decay
  A b1, b2;               // beta1, beta2
  A one_b1, one_b2;       // 1 - beta1, 1 - beta2
  A step_size;            // lr / (1 - beta1^step)
  A rsqrt_bc2;            // 1 / sqrt(1 - beta2^step)
  A eps;
};

// param, grad, m, v [n], in place:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = (1 - lr wd) p - step_size m / (sqrt(v) rsqrt_bc2 + eps)
template <typename T>
__global__ void adamw_kernel(T* p, const T* g, T* m, T* v, int64_t n, AdamWParams<Acc<T>> c) {
  using A = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const A gi = load(g + i);
    const A mi = c.b1 * load(m + i) + c.one_b1 * gi;
    const A vi = c.b2 * load(v + i) + c.one_b2 * gi * gi;
    m[i] = from_acc<T>(mi);
    v[i] = from_acc<T>(vi);
    p[i] = from_acc<T>(c.decay * load(p + i) -
                       c.step_size * mi / (sqrt_acc(vi) * c.rsqrt_bc2 + c.eps));
  }
}
}  // namespace

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                               const AdamWArgs& args) {
  const int64_t n = param.numel();
  if (n == 0) return;
  dispatch_float(param.dtype(), "adamw_update", [&](auto z) {
    using T = decltype(z);
    using A = Acc<T>;
    const double step = static_cast<double>(args.step);
    AdamWParams<A> c;
    c.decay = static_cast<A>(1.0 - args.lr * args.weight_decay);
    c.b1 = static_cast<A>(args.beta1);
    c.b2 = static_cast<A>(args.beta2);
    c.one_b1 = static_cast<A>(1.0 - args.beta1);
    c.one_b2 = static_cast<A>(1.0 - args.beta2);
    c.step_size = static_cast<A>(args.lr / (1.0 - std::pow(args.beta1, step)));
    c.rsqrt_bc2 = static_cast<A>(1.0 / std::sqrt(1.0 - std::pow(args.beta2, step)));
    c.eps = static_cast<A>(args.eps);
    adamw_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        param.data<T>(), grad.data<T>(), m.data<T>(), v.data<T>(), n, c);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
