// CUDA rotary embedding, as core/cpu/ops/rope.cpp: pairs (i, i + Dh/2) of every head rotated by
// pos * theta^(-2i/Dh). Angles are computed in double, one (cos, sin) table per token shared by
// all its heads, so positions in the millions stay accurate. The frequencies come from the host's
// std::pow, the CPU's very values: the device's pow may differ in the last bit, which a position
// of 10^5 turns into a 1e-11 error of the angle. The table is rounded to Acc<T> and the rotation
// runs in Acc<T>, as the CPU's in T.
// Work split: two kernels. rope_angle_table writes every token's (cos, sin) for i < Dh/2 to a
// [N, Dh/2] scratch table, one double-precision sincos per (token, i) instead of per head, one
// thread each. rope_rotate_pairs then rotates with one thread per (token, head, V columns of
// each half), 16-byte loads and stores where Dh/2 and the pointers allow, the table read through
// L2. One block a token with the sincos in front (the first version) left an H200 at a quarter
// of its bandwidth (220 us for 64 x 1024 tokens of 12 x 64 bf16); eight tokens a block with a
// serial rotation loop took 278 us.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {
constexpr int64_t kTableChunk = 256;
// theta^(-2i/Dh) for i < kTableChunk, by value (2 KB of kernel parameters); beyond that (Dh over
// 512) the device's pow.
struct Frequencies {
  double f[kTableChunk];
};

// pos [N] -> cos_t, sin_t [N, half]: angle pos * theta^(-2i/Dh); sin carries the sign
// (-1: the inverse rotation of backward).
template <typename A, typename I>
__global__ void rope_angle_table(const I* pos, int64_t tokens, int64_t half, double theta,
                                 const Frequencies freq, double sign, A* cos_t, A* sin_t) {
  const int64_t n = tokens * half, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += stride) {
    const int64_t t = e / half, i = e - t * half;
    const double f = i < kTableChunk
                         ? freq.f[i]
                         : pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(2 * half));
    double s, c;
    sincos(static_cast<double>(pos[t]) * f, &s, &c);
    cos_t[e] = static_cast<A>(c);
    sin_t[e] = static_cast<A>(sign * s);
  }
}

// x, y [N, H, Dh] (N = B*T tokens): pairs (i, i + half) rotated by the table's angle of (token,
// i). One thread per (token, head, V consecutive i); V divides half and x, y are aligned to V
// elements (the host checks).
template <int V, typename T>
__global__ void rope_rotate_pairs(const T* x, const Acc<T>* cos_t, const Acc<T>* sin_t,
                                  int64_t tokens, int64_t heads, int64_t half, T* y) {
  using A = Acc<T>;
  const int64_t vecs = half / V, n = tokens * heads * vecs, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < n; q += stride) {
    const int64_t th = q / vecs, i = (q - th * vecs) * V, t = th / heads;  // th = t * heads + h
    const int64_t lo = th * 2 * half + i;  // element i; its partner is lo + half
    const Pack<T, V> a = *reinterpret_cast<const Pack<T, V>*>(x + lo);
    const Pack<T, V> b = *reinterpret_cast<const Pack<T, V>*>(x + lo + half);
    Pack<T, V> ya, yb;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A x1 = to_acc<T>(a.v[e]), x2 = to_acc<T>(b.v[e]);
      const A c = cos_t[t * half + i + e], s = sin_t[t * half + i + e];
      ya.v[e] = from_acc<T>(x1 * c - x2 * s);
      yb.v[e] = from_acc<T>(x1 * s + x2 * c);
    }
    *reinterpret_cast<Pack<T, V>*>(y + lo) = ya;
    *reinterpret_cast<Pack<T, V>*>(y + lo + half) = yb;
  }
}
}  // namespace

// x, y [B, T, H, Dh] (Dh even), pos [B, T] (i32/i64, >= 0)
void CudaBackend::rope(const Tensor& x, const Tensor& pos, double theta, bool inverse,
                       Tensor& y) {
  const int64_t tokens = x.size(0) * x.size(1), heads = x.size(2), dh = x.size(3);
  if (tokens * heads * dh == 0) return;
  const int64_t half = dh / 2;
  const double sign = inverse ? -1.0 : 1.0;
  Frequencies freq{};
  for (int64_t i = 0; i < std::min(kTableChunk, half); ++i)  // the CPU's inv_freq, same expression
    freq.f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
  dispatch_float(x.dtype(), "rope", [&](auto z) {
    using T = decltype(z);
    using A = Acc<T>;
    Tensor cos_t = Tensor::empty({tokens, half}, acc_dtype<T>(), Device::CUDA);
    Tensor sin_t = Tensor::empty({tokens, half}, acc_dtype<T>(), Device::CUDA);
    dispatch_index(pos.dtype(), "rope", [&](auto zi) {
      using I = decltype(zi);
      rope_angle_table<<<grid_for(tokens * half), kThreads, 0, compute_stream()>>>(
          pos.data<I>(), tokens, half, theta, freq, sign, cos_t.data<A>(), sin_t.data<A>());
      MOD_CUDA_CHECK_LAUNCH();
    });
    // 16 bytes at a time where every pack of each half starts aligned.
    constexpr int kWide = static_cast<int>(16 / sizeof(T));
    const bool wide = half % kWide == 0 && pack_width(x.data<T>(), y.data<T>()) == kWide;
    const int64_t work = tokens * heads * half;
    if (wide)
      rope_rotate_pairs<kWide><<<grid_for(work / kWide), kThreads, 0, compute_stream()>>>(
          x.data<T>(), cos_t.data<A>(), sin_t.data<A>(), tokens, heads, half, y.data<T>());
    else
      rope_rotate_pairs<1><<<grid_for(work), kThreads, 0, compute_stream()>>>(
          x.data<T>(), cos_t.data<A>(), sin_t.data<A>(), tokens, heads, half, y.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
