// CUDA sigmoid binary cross-entropy with logits, elementwise, as core/cpu/ops/loss.cpp: the
// forward never exponentiates a positive number, so it is finite for any finite logit.
// Arithmetic in Acc<T> with the accurate expf/log1pf (not the __expf intrinsics).
// Work split: one grid-stride loop over the flat index (coalesced, any n).
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

// logits, targets, losses [n]: losses = max(x,0) - x*t + log(1 + exp(-|x|))
template <typename T>
__global__ void bce_forward_kernel(const T* logits, const T* targets, T* losses, int64_t n) {
  using A = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const A x = load(logits + i), t = load(targets + i);
    const A pos = x < A(0) ? A(0) : x;  // std::max(x, 0): a NaN logit stays NaN
    losses[i] = from_acc<T>(pos - x * t + acc_log1p(acc_exp(-acc_abs(x))));
  }
}

// logits, targets, dlogits [n]: dlogits = grad_scale * (sigmoid(x) - t); exp(-x) overflowing
// to inf gives sigmoid 0, not NaN.
template <typename T>
__global__ void bce_backward_kernel(const T* logits, const T* targets, Acc<T> grad_scale,
                                    T* dlogits, int64_t n) {
  using A = Acc<T>;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const A x = load(logits + i), t = load(targets + i);
    dlogits[i] = from_acc<T>(grad_scale * (acc_sigmoid(x) - t));
  }
}
}  // namespace

void CudaBackend::bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                                          Tensor& losses) {
  const int64_t n = logits.numel();
  if (n == 0) return;
  dispatch_float(logits.dtype(), "bce_with_logits_forward", [&](auto z) {
    using T = decltype(z);
    bce_forward_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        logits.data<T>(), targets.data<T>(), losses.data<T>(), n);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::bce_with_logits_backward(const Tensor& logits, const Tensor& targets,
                                           double grad_scale, Tensor& dlogits) {
  const int64_t n = logits.numel();
  if (n == 0) return;
  dispatch_float(logits.dtype(), "bce_with_logits_backward", [&](auto z) {
    using T = decltype(z);
    bce_backward_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        logits.data<T>(), targets.data<T>(), static_cast<Acc<T>>(grad_scale), dlogits.data<T>(),
        n);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
