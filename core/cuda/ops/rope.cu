// CUDA rotary embedding, as core/cpu/ops/rope.cpp: pairs (i, i + Dh/2) of every head rotated by
// pos * theta^(-2i/Dh). Angles are computed in double, once per (token, i) and shared by all the
// token's heads, so positions in the millions stay accurate. The frequencies come from the
// host's std::pow, the CPU's very values: the device's pow may differ in the last bit, which a
// position of 10^5 turns into a 1e-11 error of the angle. The angles are rounded to Acc<T> and
// the rotation runs in Acc<T>, as the CPU's in T.
// Work split: one block per group of consecutive tokens. Each thread first loads its (up to
// kPacks) column packs of the group, 16 bytes wide where Dh/2 and the pointers allow, so the
// loads are in flight while the block computes the group's angles into shared memory (one
// double sincos per (token, i)); then it rotates and stores. Consecutive threads take
// consecutive packs, so a warp reads and writes contiguous memory. A global angle table read
// per head is L2-bound, and a thread per token looping over the heads makes each head a pass of
// its own; index arithmetic is 32-bit, 64-bit divisions being costly (docs/gpu.md,
// "Measurements behind the CUDA kernels", times the versions tried).
#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {
constexpr int64_t kHostFrequencies = 256;
constexpr int64_t kAngleBytes = 32 * 1024;  // shared memory for a group's angles, at most
// Column packs a thread holds in registers, and the blocks an SM keeps (64 registers a thread):
// the fastest of the settings timed (docs/gpu.md).
constexpr int kPacks = 2;
constexpr int kMinBlocks = 4;
// theta^(-2i/Dh) from the host for i < kHostFrequencies, by value (2 KB of kernel parameters,
// indexed in place as a __grid_constant__); beyond that (Dh over 512) the device's pow.
struct Frequencies {
  double f[kHostFrequencies];
};

// V consecutive Acc values from shared memory: 16-byte loads where V of them fill whole ones (the
// wide packs; the offsets are then multiples of V), else one at a time.
template <int V, typename A>
__device__ __forceinline__ void load_angles(const A* src, A (&dst)[V]) {
  constexpr int kW = static_cast<int>(16 / sizeof(A));
  if constexpr (V % kW == 0) {
#pragma unroll
    for (int w = 0; w < V; w += kW) {
      const Pack<A, kW> p = *reinterpret_cast<const Pack<A, kW>*>(src + w);
#pragma unroll
      for (int e = 0; e < kW; ++e) dst[w + e] = p.v[e];
    }
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) dst[e] = src[e];
  }
}

// Pack p (< the group's packs) of a group starting at token t0: where it lies in x and which
// angles it needs.
struct PackAt {
  int lo;     // offset of element i from the group's first element; its partner is + half
  int angle;  // offset of (token, i) in the group's angle table
};
__device__ __forceinline__ PackAt pack_at(int p, int vecs, int heads, int half, int v) {
  const int th = p / vecs, i = (p - th * vecs) * v, tt = th / heads;  // th = tt * heads + h
  return {th * 2 * half + i, tt * half + i};
}

// x, y [N, H, Dh] (N = B*T tokens), pos [N]: pairs (i, i + half) rotated by the angle
// pos * freq(i); sign -1 gives the inverse rotation of backward. Block b takes tokens
// [b * group, (b + 1) * group). V divides half and x, y are aligned to V elements (the host
// checks); x and y never alias (rope's output is fresh).
template <int V, typename T, typename I>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    rope_rotate_tokens(const T* __restrict__ x, const I* __restrict__ pos, int64_t tokens,
                       int heads, int half, int group, double theta,
                       const __grid_constant__ Frequencies freq, double sign, T* __restrict__ y) {
  using A = Acc<T>;
  extern __shared__ __align__(16) unsigned char shared[];
  A* cos_s = reinterpret_cast<A*>(shared);  // [group, half]
  A* sin_s = cos_s + group * half;          // [group, half]
  // Within a group every index fits 32 bits (the host checks): cheaper divisions.
  const int64_t t0 = blockIdx.x * int64_t(group);
  const int g = static_cast<int>(min(int64_t(group), tokens - t0)), vecs = half / V;
  const int n = g * heads * vecs, tid = threadIdx.x, threads = blockDim.x;
  const T* xg = x + t0 * heads * 2 * half;
  T* yg = y + t0 * heads * 2 * half;

  Pack<T, V> a[kPacks], b[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = tid + k * threads;
    if (p < n) {
      const int lo = pack_at(p, vecs, heads, half, V).lo;
      a[k] = *reinterpret_cast<const Pack<T, V>*>(xg + lo);
      b[k] = *reinterpret_cast<const Pack<T, V>*>(xg + lo + half);
    }
  }
  for (int e = tid; e < g * half; e += threads) {
    const int tt = e / half, i = e - tt * half;
    const double f = i < kHostFrequencies ? freq.f[i]
                                     : pow(theta, -2.0 * static_cast<double>(i) /
                                                      static_cast<double>(2 * half));
    double s, c;
    sincos(static_cast<double>(pos[t0 + tt]) * f, &s, &c);
    cos_s[e] = static_cast<A>(c);
    sin_s[e] = static_cast<A>(sign * s);
  }
  __syncthreads();

  auto rotate = [&](const Pack<T, V>& pa, const Pack<T, V>& pb, const PackAt& at) {
    A c[V], s[V];
    load_angles<V>(cos_s + at.angle, c);
    load_angles<V>(sin_s + at.angle, s);
    Pack<T, V> ya, yb;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A x1 = to_acc<T>(pa.v[e]), x2 = to_acc<T>(pb.v[e]);
      ya.v[e] = from_acc<T>(x1 * c[e] - x2 * s[e]);
      yb.v[e] = from_acc<T>(x1 * s[e] + x2 * c[e]);
    }
    *reinterpret_cast<Pack<T, V>*>(yg + at.lo) = ya;
    *reinterpret_cast<Pack<T, V>*>(yg + at.lo + half) = yb;
  };
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int p = tid + k * threads;
    if (p < n) rotate(a[k], b[k], pack_at(p, vecs, heads, half, V));
  }
  // A token wider than the registers hold (heads x Dh/2 over kPacks x kThreads packs).
  for (int p = tid + kPacks * threads; p < n; p += threads) {
    const PackAt at = pack_at(p, vecs, heads, half, V);
    rotate(*reinterpret_cast<const Pack<T, V>*>(xg + at.lo),
           *reinterpret_cast<const Pack<T, V>*>(xg + at.lo + half), at);
  }
}

template <int V, typename T, typename I>
void launch_rope(const T* x, const I* pos, int64_t tokens, int64_t heads, int64_t half,
                 double theta, const Frequencies& freq, double sign, T* y) {
  using A = Acc<T>;
  const int64_t angle_bytes = 2 * half * static_cast<int64_t>(sizeof(A));  // a token's
  if (angle_bytes > kAngleBytes)
    throw std::invalid_argument("rope: head dim " + std::to_string(2 * half) +
                                " is over the CUDA kernel's " +
                                std::to_string(kAngleBytes / static_cast<int64_t>(sizeof(A))) +
                                " for this dtype");
  const int64_t packs = heads * (half / V);  // a token's
  const int64_t group =
      std::clamp<int64_t>(kPacks * kThreads / packs, 1, kAngleBytes / angle_bytes);
  const int64_t blocks = (tokens + group - 1) / group;
  if (blocks > INT_MAX || group * packs * 2 * V > INT_MAX)
    throw std::invalid_argument("rope: too many tokens or heads x Dh for one launch");
  rope_rotate_tokens<V><<<static_cast<unsigned>(blocks), kThreads,
                          static_cast<size_t>(group * angle_bytes), compute_stream()>>>(
      x, pos, tokens, static_cast<int>(heads), static_cast<int>(half), static_cast<int>(group),
      theta, freq, sign, y);
  MOD_CUDA_CHECK_LAUNCH();
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
  // The CPU's inv_freq, same expression.
  for (int64_t i = 0; i < std::min(kHostFrequencies, half); ++i)
    freq.f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(dh));
  dispatch_float(x.dtype(), "rope", [&](auto z) {
    using T = decltype(z);
    dispatch_index(pos.dtype(), "rope", [&](auto zi) {
      using I = decltype(zi);
      // 16 bytes at a time where every pack of each half starts aligned.
      constexpr int kWide = static_cast<int>(16 / sizeof(T));
      const bool wide = half % kWide == 0 && pack_width(x.data<T>(), y.data<T>()) == kWide;
      if (wide)
        launch_rope<kWide>(x.data<T>(), pos.data<I>(), tokens, heads, half, theta, freq, sign,
                           y.data<T>());
      else
        launch_rope<1>(x.data<T>(), pos.data<I>(), tokens, heads, half, theta, freq, sign,
                       y.data<T>());
    });
  });
}

}  // namespace mod::cuda
