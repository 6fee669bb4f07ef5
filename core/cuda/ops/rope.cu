// CUDA rotary embedding, as core/cpu/ops/rope.cpp: pairs (i, i + Dh/2) of every head rotated by
// pos * theta^(-2i/Dh). Angles are computed in double, one (cos, sin) table per token shared by
// all its heads, so positions in the millions stay accurate. The frequencies come from the host's
// std::pow, the CPU's very values: the device's pow may differ in the last bit, which a position
// of 10^5 turns into a 1e-11 error of the angle. The table is rounded to Acc<T> and the rotation
// runs in Acc<T>, as the CPU's in T.
// Work split: a block per kTokensPerBlock tokens (grid-stride over token groups). Its threads
// first fill the tokens' tables in shared memory (kTableChunk entries a token at a time, so any
// Dh fits), then rotate all their H * Dh/2 pairs, V elements of each half at a time (16-byte
// loads and stores where Dh/2 and the pointers allow): coalesced, and the double-precision
// sincos runs once per (token, i) instead of once per head. One token a block left an H200 at
// a quarter of its bandwidth (220 us for 64 x 1024 tokens of 12 x 64 bf16).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {
constexpr int64_t kTableChunk = 256;  // table entries per pass; Dh <= 512 takes one pass
constexpr int64_t kMaxBlocks = 65535 * 8;
constexpr int kTokensPerBlock = 8;

// theta^(-2i/Dh) for i < kTableChunk, by value (2 KB of kernel parameters); beyond that (Dh over
// 512) the device's pow.
struct Frequencies {
  double f[kTableChunk];
};

// x, y [N, H, Dh] (N = B*T tokens), pos [N]; sign = -1 for the inverse (backward) rotation.
// V divides Dh/2 and x, y are aligned to V elements (the host checks).
template <int V, typename T, typename I>
__global__ void __launch_bounds__(kThreads)
    rope_rotate_pairs(const T* x, const I* pos, int64_t tokens, int heads, int64_t dh,
                      double theta, const Frequencies freq, double sign, T* y) {
  using A = Acc<T>;
  __shared__ A cos_t[kTokensPerBlock][kTableChunk], sin_t[kTokensPerBlock][kTableChunk];
  const int64_t half = dh / 2;
  for (int64_t t0 = int64_t(blockIdx.x) * kTokensPerBlock; t0 < tokens;
       t0 += int64_t(gridDim.x) * kTokensPerBlock) {
    const int nt = static_cast<int>(min(int64_t{kTokensPerBlock}, tokens - t0));
    for (int64_t i0 = 0; i0 < half; i0 += kTableChunk) {
      const int len = static_cast<int>(min(kTableChunk, half - i0));
      for (int e = threadIdx.x; e < nt * len; e += blockDim.x) {
        const int k = e / len, j = e - k * len;
        const int64_t i = i0 + j;
        const double f = i < kTableChunk
                             ? freq.f[i]
                             : pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
        double s, c;
        sincos(static_cast<double>(pos[t0 + k]) * f, &s, &c);
        cos_t[k][j] = static_cast<A>(c);
        sin_t[k][j] = static_cast<A>(sign * s);
      }
      __syncthreads();
      const int vecs = len / V, work = nt * heads * vecs;
      for (int q = threadIdx.x; q < work; q += blockDim.x) {
        const int th = q / vecs, j = (q - th * vecs) * V, k = th / heads;  // th = k * heads + h
        const int64_t lo = (t0 * heads + th) * dh + i0 + j;  // element i; its partner is lo + half
        const Pack<T, V> a = *reinterpret_cast<const Pack<T, V>*>(x + lo);
        const Pack<T, V> b = *reinterpret_cast<const Pack<T, V>*>(x + lo + half);
        Pack<T, V> ya, yb;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const A x1 = to_acc<T>(a.v[e]), x2 = to_acc<T>(b.v[e]);
          const A c = cos_t[k][j + e], s = sin_t[k][j + e];
          ya.v[e] = from_acc<T>(x1 * c - x2 * s);
          yb.v[e] = from_acc<T>(x1 * s + x2 * c);
        }
        *reinterpret_cast<Pack<T, V>*>(y + lo) = ya;
        *reinterpret_cast<Pack<T, V>*>(y + lo + half) = yb;
      }
      __syncthreads();  // the tables are refilled for the next chunk or token group
    }
  }
}
}  // namespace

// x, y [B, T, H, Dh] (Dh even), pos [B, T] (i32/i64, >= 0)
void CudaBackend::rope(const Tensor& x, const Tensor& pos, double theta, bool inverse,
                       Tensor& y) {
  const int64_t tokens = x.size(0) * x.size(1), heads = x.size(2), dh = x.size(3);
  if (tokens * heads * dh == 0) return;
  const unsigned blocks = static_cast<unsigned>(
      std::min((tokens + kTokensPerBlock - 1) / kTokensPerBlock, kMaxBlocks));
  const double sign = inverse ? -1.0 : 1.0;
  Frequencies freq{};
  for (int64_t i = 0; i < std::min(kTableChunk, dh / 2); ++i)  // the CPU's inv_freq, same expression
    freq.f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
  dispatch_float(x.dtype(), "rope", [&](auto z) {
    using T = decltype(z);
    dispatch_index(pos.dtype(), "rope", [&](auto zi) {
      using I = decltype(zi);
      // 16 bytes at a time where every pack of each half starts aligned; kTableChunk is a
      // multiple of any V, so V divides every chunk's length when it divides Dh/2.
      constexpr int kWide = static_cast<int>(16 / sizeof(T));
      const bool wide = (dh / 2) % kWide == 0 && pack_width(x.data<T>(), y.data<T>()) == kWide;
      auto launch = [&](auto v) {
        rope_rotate_pairs<decltype(v)::value><<<blocks, kThreads, 0, compute_stream()>>>(
            x.data<T>(), pos.data<I>(), tokens, static_cast<int>(heads), dh, theta, freq, sign,
            y.data<T>());
      };
      if (wide)
        launch(std::integral_constant<int, kWide>{});
      else
        launch(std::integral_constant<int, 1>{});
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mod::cuda
