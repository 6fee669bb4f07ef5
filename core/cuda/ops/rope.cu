// CUDA rotary embedding, as core/cpu/ops/rope.cpp: pairs (i, i + Dh/2) of every head rotated by
// pos * theta^(-2i/Dh). Angles are computed in double, one (cos, sin) table per token shared by
// all its heads, so positions in the millions stay accurate. The frequencies come from the host's
// std::pow, the CPU's very values: the device's pow may differ in the last bit, which a position
// of 10^5 turns into a 1e-11 error of the angle. The table is rounded to Acc<T> and the rotation
// runs in Acc<T>, as the CPU's in T.
// Work split: a block per token (grid-stride over tokens). Its threads first fill the token's
// table in shared memory (kTableChunk entries at a time, so any Dh fits), then rotate all
// H * Dh/2 pairs with consecutive threads on consecutive i: coalesced, and the double-precision
// sincos runs once per (token, i) instead of once per head.
#include <algorithm>
#include <cmath>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {
constexpr int64_t kTableChunk = 256;  // table entries per pass; Dh <= 512 takes one pass
constexpr int64_t kMaxBlocks = 65535 * 8;

// theta^(-2i/Dh) for i < kTableChunk, by value (2 KB of kernel parameters); beyond that (Dh over
// 512) the device's pow.
struct Frequencies {
  double f[kTableChunk];
};

// x, y [N, H, Dh] (N = B*T tokens), pos [N]; sign = -1 for the inverse (backward) rotation.
template <typename T, typename I>
__global__ void rope_rotate_pairs(const T* x, const I* pos, int64_t tokens, int64_t heads,
                                  int64_t dh, double theta, const Frequencies freq,
                                  double sign, T* y) {
  using A = Acc<T>;
  __shared__ A cos_t[kTableChunk], sin_t[kTableChunk];
  const int64_t half = dh / 2;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const double p = static_cast<double>(pos[t]);
    for (int64_t i0 = 0; i0 < half; i0 += kTableChunk) {
      const int64_t len = min(kTableChunk, half - i0);
      for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const int64_t i = i0 + j;
        const double f = i < kTableChunk
                             ? freq.f[i]
                             : pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
        double s, c;
        sincos(p * f, &s, &c);
        cos_t[j] = static_cast<A>(c);
        sin_t[j] = static_cast<A>(sign * s);
      }
      __syncthreads();
      const int64_t pairs = heads * len;
      for (int64_t q = threadIdx.x; q < pairs; q += blockDim.x) {
        const int64_t h = q / len, j = q - h * len;
        const int64_t lo = (t * heads + h) * dh + i0 + j;  // element i; its partner is lo + half
        const A x1 = load(x + lo), x2 = load(x + lo + half);
        const A c = cos_t[j], s = sin_t[j];
        y[lo] = from_acc<T>(x1 * c - x2 * s);
        y[lo + half] = from_acc<T>(x1 * s + x2 * c);
      }
      __syncthreads();  // the table is refilled for the next chunk or token
    }
  }
}
}  // namespace

// x, y [B, T, H, Dh] (Dh even), pos [B, T] (i32/i64, >= 0)
void CudaBackend::rope(const Tensor& x, const Tensor& pos, double theta, bool inverse,
                       Tensor& y) {
  const int64_t tokens = x.size(0) * x.size(1), heads = x.size(2), dh = x.size(3);
  if (tokens * heads * dh == 0) return;
  // Enough threads for one chunk's pairs, in whole warps, at most kThreads.
  const int64_t pairs = heads * std::min(kTableChunk, dh / 2);
  const int threads = static_cast<int>(std::min<int64_t>(kThreads, (pairs + 31) / 32 * 32));
  const unsigned blocks = static_cast<unsigned>(std::min(tokens, kMaxBlocks));
  const double sign = inverse ? -1.0 : 1.0;
  Frequencies freq{};
  for (int64_t i = 0; i < std::min(kTableChunk, dh / 2); ++i)  // the CPU's inv_freq, same expression
    freq.f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
  dispatch_float(x.dtype(), "rope", [&](auto z) {
    using T = decltype(z);
    dispatch_index(pos.dtype(), "rope", [&](auto zi) {
      using I = decltype(zi);
      rope_rotate_pairs<<<blocks, threads, 0, compute_stream()>>>(
          x.data<T>(), pos.data<I>(), tokens, heads, dh, theta, freq, sign, y.data<T>());
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mod::cuda
