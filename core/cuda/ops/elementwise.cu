// CUDA elementwise kernels: binary ops with trailing-dim broadcast, scale and axpy; the same
// math as core/cpu/ops/elementwise.cpp, evaluated in Acc<T>.
// Work split: same-shape operands, scale and axpy are pointwise.cuh's wide kernels; broadcast
// modes run one grid-stride loop over the flat index (coalesced, any n) that walks (row, col)
// incrementally instead of dividing a 64-bit index per element, which would cost more than the
// memory traffic. Outputs may alias inputs (in-place calls are common), so no __restrict__.
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

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

template <BinaryKind K>
struct BinaryOp {
  template <typename A>
  __device__ A operator()(A x, A y) const {
    return apply_binary<K>(x, y);
  }
};

// a, out [outer, inner] flat (n = outer * inner > 0); b [inner] or [outer] by B.
template <BinaryKind K, Broadcast B, typename T>
__global__ void binary_broadcast_kernel(const T* a, const T* b, T* out, int64_t n, int64_t inner) {
  for (GridRowCol at(inner); at.i < n; at.next()) {
    const int64_t j = B == Broadcast::Inner ? at.col : at.row;
    out[at.i] = from_acc<T>(apply_binary<K>(load(a + at.i), load(b + j)));
  }
}

template <BinaryKind K, typename T>
void launch_binary(Broadcast bcast, int64_t n, int64_t inner, const T* a, const T* b, T* out) {
  const unsigned blocks = grid_for(n);
  cudaStream_t s = compute_stream();
  switch (bcast) {
    case Broadcast::Same: return launch_pointwise(n, a, b, out, BinaryOp<K>{});
    case Broadcast::Inner:
      binary_broadcast_kernel<K, Broadcast::Inner><<<blocks, kThreads, 0, s>>>(a, b, out, n, inner);
      break;
    case Broadcast::Outer:
      binary_broadcast_kernel<K, Broadcast::Outer><<<blocks, kThreads, 0, s>>>(a, b, out, n, inner);
      break;
  }
  MOD_CUDA_CHECK_LAUNCH();
}

// out = alpha * x
template <typename A>
struct Scale {
  A alpha;
  __device__ A operator()(A x) const { return alpha * x; }
};

// y += alpha * x, as op(y, x)
template <typename A>
struct Axpy {
  A alpha;
  __device__ A operator()(A y, A x) const { return y + alpha * x; }
};

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
    launch_pointwise(n, x.data<T>(), out.data<T>(), Scale<Acc<T>>{static_cast<Acc<T>>(alpha)});
  });
}

void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
  const int64_t n = y.numel();
  if (n == 0) return;
  dispatch_float(y.dtype(), "axpy", [&](auto z) {
    using T = decltype(z);
    launch_pointwise(n, static_cast<const T*>(y.data<T>()), x.data<T>(), y.data<T>(),
                     Axpy<Acc<T>>{static_cast<Acc<T>>(alpha)});
  });
}

}  // namespace mod::cuda
