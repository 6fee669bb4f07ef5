// Flat pointwise kernels with wide memory access: out[i] = op(a[i]) or op(a[i], b[i]), each
// thread moving a Pack of V consecutive elements (16 bytes of the widest element type: 8 bf16,
// 4 f32) through single vector loads and stores: scalar bf16 loads leave most of the memory
// bandwidth unused (docs/gpu.md). Where a pointer is not aligned to its pack (a view at an odd
// offset) the kernel moves one element at a time. op takes and returns Acc values; out may alias
// an input (each thread reads its whole pack before writing it).
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// An Acc value stored as O: bf16 by way of float (as convert always did), else a cast.
template <typename O, typename A>
__device__ __forceinline__ O store_as(A v) {
  if constexpr (std::is_same_v<O, bf16>)
    return __float2bfloat16(static_cast<float>(v));
  else
    return static_cast<O>(v);
}

template <int V, typename O, typename A, typename Op>
__global__ void pointwise1_kernel(const A* a, O* out, int64_t n, Op op) {
  const int64_t packs = (n + V - 1) / V, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += stride) {
    const int64_t i = p * V;
    if (i + V <= n) {
      const Pack<A, V> x = *reinterpret_cast<const Pack<A, V>*>(a + i);
      Pack<O, V> y;
#pragma unroll
      for (int e = 0; e < V; ++e) y.v[e] = store_as<O>(op(to_acc<A>(x.v[e])));
      *reinterpret_cast<Pack<O, V>*>(out + i) = y;
    } else {
      for (int64_t j = i; j < n; ++j) out[j] = store_as<O>(op(to_acc<A>(a[j])));
    }
  }
}

template <int V, typename O, typename A, typename B, typename Op>
__global__ void pointwise2_kernel(const A* a, const B* b, O* out, int64_t n, Op op) {
  const int64_t packs = (n + V - 1) / V, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < packs; p += stride) {
    const int64_t i = p * V;
    if (i + V <= n) {
      const Pack<A, V> x = *reinterpret_cast<const Pack<A, V>*>(a + i);
      const Pack<B, V> y = *reinterpret_cast<const Pack<B, V>*>(b + i);
      Pack<O, V> z;
#pragma unroll
      for (int e = 0; e < V; ++e) z.v[e] = store_as<O>(op(to_acc<A>(x.v[e]), to_acc<B>(y.v[e])));
      *reinterpret_cast<Pack<O, V>*>(out + i) = z;
    } else {
      for (int64_t j = i; j < n; ++j) out[j] = store_as<O>(op(to_acc<A>(a[j]), to_acc<B>(b[j])));
    }
  }
}

// Elements per pack: 16 bytes of the widest type, 1 where a pointer is not aligned to its pack.
template <typename... T>
int pack_width(const T*... ptrs) {
  const int v = static_cast<int>(16 / std::max({sizeof(T)...}));
  const bool aligned = ((reinterpret_cast<uintptr_t>(ptrs) % (sizeof(T) * v) == 0) && ...);
  return aligned ? v : 1;
}

// out[i] = op(a[i]) for i < n, on the compute stream.
template <typename O, typename A, typename Op>
void launch_pointwise(int64_t n, const A* a, O* out, Op op) {
  if (n == 0) return;
  constexpr int kWide = static_cast<int>(16 / std::max(sizeof(A), sizeof(O)));
  const int v = pack_width(a, static_cast<const O*>(out));
  if (v == kWide)
    pointwise1_kernel<kWide><<<grid_for((n + kWide - 1) / kWide), kThreads, 0, compute_stream()>>>(
        a, out, n, op);
  else
    pointwise1_kernel<1><<<grid_for(n), kThreads, 0, compute_stream()>>>(a, out, n, op);
  MOD_CUDA_CHECK_LAUNCH();
}

// out[i] = op(a[i], b[i]) for i < n, on the compute stream.
template <typename O, typename A, typename B, typename Op>
void launch_pointwise(int64_t n, const A* a, const B* b, O* out, Op op) {
  if (n == 0) return;
  constexpr int kWide = static_cast<int>(16 / std::max({sizeof(A), sizeof(B), sizeof(O)}));
  const int v = pack_width(a, b, static_cast<const O*>(out));
  if (v == kWide)
    pointwise2_kernel<kWide><<<grid_for((n + kWide - 1) / kWide), kThreads, 0, compute_stream()>>>(
        a, b, out, n, op);
  else
    pointwise2_kernel<1><<<grid_for(n), kThreads, 0, compute_stream()>>>(a, b, out, n, op);
  MOD_CUDA_CHECK_LAUNCH();
}

}  // namespace mod::cuda
