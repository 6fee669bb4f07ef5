// CUDA elementwise kernels: binary ops with trailing-dim broadcast, scale and axpy; the same
// math as core/cpu/ops/elementwise.cpp, evaluated in Acc<T>.
// Work split: one grid-stride loop over the flat index, so consecutive threads touch consecutive
// elements (coalesced) and any n fits the grid. Broadcast modes walk (row, col) incrementally
// instead of dividing a 64-bit index per element, which would cost more than the memory traffic.
// Outputs may alias inputs (in-place calls are common), so no __restrict__ and no __ldg.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

template <BinaryKind K, typename A>
__device__ __forceinline__ A apply_binary(A x, A y) {
  if constexpr (K == BinaryKind::Add)
    return x + y;
  else if constexpr (K == BinaryKind::Sub)
    return x - y;
  else
    return x * y;
}

// a, out [outer, inner] flat (n = outer * inner > 0); b [n], [inner] or [outer] by B.
template <BinaryKind K, Broadcast B, typename T>
__global__ void binary_kernel(const T* a, const T* b, T* out, int64_t n, int64_t inner) {
  if constexpr (B == Broadcast::Same) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += stride)
      out[i] = from_acc<T>(apply_binary<K>(load(a + i), load(b + i)));
  } else {
    for (GridRowCol at(inner); at.i < n; at.next()) {
      const int64_t j = B == Broadcast::Inner ? at.col : at.row;
      out[at.i] = from_acc<T>(apply_binary<K>(load(a + at.i), load(b + j)));
    }
  }
}

template <BinaryKind K, typename T>
void launch_binary(Broadcast bcast, int64_t n, int64_t inner, const T* a, const T* b, T* out) {
  const unsigned blocks = grid_for(n);
  cudaStream_t s = compute_stream();
  switch (bcast) {
    case Broadcast::Same:
      binary_kernel<K, Broadcast::Same><<<blocks, kThreads, 0, s>>>(a, b, out, n, inner);
      break;
    case Broadcast::Inner:
      binary_kernel<K, Broadcast::Inner><<<blocks, kThreads, 0, s>>>(a, b, out, n, inner);
      break;
    case Broadcast::Outer:
      binary_kernel<K, Broadcast::Outer><<<blocks, kThreads, 0, s>>>(a, b, out, n, inner);
      break;
  }
  MOD_CUDA_CHECK_LAUNCH();
}

// x, out [n]: out = alpha * x
template <typename T>
__global__ void scale_kernel(const T* x, Acc<T> alpha, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_acc<T>(alpha * load(x + i));
}

// x, y [n]: y += alpha * x
template <typename T>
__global__ void axpy_kernel(Acc<T> alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_acc<T>(load(y + i) + alpha * load(x + i));
}

}  // namespace

void CudaBackend::binary(BinaryKind kind, Broadcast bcast, int64_t outer, int64_t inner,
                         const Tensor& a, const Tensor& b, Tensor& out) {
  const int64_t n = outer * inner;
  if (n == 0) return;
  dispatch_float(out.dtype(), "binary", [&](auto z) {
    using T = decltype(z);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    switch (kind) {
      case BinaryKind::Add: launch_binary<BinaryKind::Add>(bcast, n, inner, pa, pb, po); break;
      case BinaryKind::Sub: launch_binary<BinaryKind::Sub>(bcast, n, inner, pa, pb, po); break;
      case BinaryKind::Mul: launch_binary<BinaryKind::Mul>(bcast, n, inner, pa, pb, po); break;
    }
  });
}

void CudaBackend::scale(const Tensor& x, double alpha, Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float(out.dtype(), "scale", [&](auto z) {
    using T = decltype(z);
    scale_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        x.data<T>(), static_cast<Acc<T>>(alpha), out.data<T>(), n);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y.dtype(), "axpy", [&](auto z) {
    using T = decltype(z);
    axpy_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        static_cast<Acc<T>>(alpha), x.data<T>(), y.data<T>(), n);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
