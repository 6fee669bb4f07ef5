// CUDA RMSNorm and LayerNorm over rows x [N,D]: the math of core/cpu/ops/norm.cpp in Acc<T>,
// alone or fused with the residual add before them (llm.c's fused_residual_forward): the
// forward's first pass reads x and a, writes s = x + a rounded to T and takes its statistics
// from that rounded s, and later passes reread s (the row the same thread just wrote, from
// cache); the backward rounds the norm's dx to T and then adds ds, as the separate ops do
// (norm backward, then the autograd's sum of s's two gradients), so the fused op is bitwise the
// separate ones: a recomputed block, which runs them separately at its boundary, matches a kept
// one (on an H200 in bf16, 2026-11-28, one rounding made tiny_dense's FULL and SELECTIVE runs
// drift from NONE by 3e-4 in 20 steps).
// Forward and the dx half of backward: one block per row (grid-stride over rows), its threads
// striding the row's D columns (coalesced), row sums combined with block_sum. Forward caches
// rstd (and mean) per row in the dtype the caller allocated: x's dtype, or f32 for bf16 x
// (S below); y itself uses the unrounded Acc statistics. dweight/dbias (overwritten, like the
// CPU) are column sums over rows: a column-parallel kernel sums fixed slabs of rows into
// [slabs, D] Acc partials, and a second kernel adds the slabs in order. No atomics, and the slab
// count depends only on N, so results are bitwise reproducible.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {

constexpr int kMaxRowThreads = 512;

// Threads for a row of `packs` packs: one pack each, in whole warps, at most kMaxRowThreads.
int wide_row_threads(int64_t packs) {
  return static_cast<int>(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxRowThreads));
}

// LayerNorm's mean and rstd share one statistics dtype.
void check_same_stats(const char* kernel, const Tensor& mean, const Tensor& rstd) {
  if (mean.dtype() != rstd.dtype())
    throw std::invalid_argument(std::string(kernel) + ": mean is " + dtype_name(mean.dtype()) +
                                " but rstd is " + dtype_name(rstd.dtype()));
}

// --- forward ---

// x, y [n,d], weight (and bias) [d], rstd (and mean) [n]; fused: a, s [n,d] (else null).
template <typename T, typename S>
struct NormForwardParams {
  const T* x;
  const T* a;  // the residual add's other operand, or nullptr
  T* s;        // x + a, written when a is given
  const T* weight;
  const T* bias;  // LayerNorm only
  T* y;
  S* mean;  // LayerNorm only
  S* rstd;
  int64_t n, d;
  Acc<T> eps;
};

// V columns a thread at a time: 16-byte packs where D and the pointers allow (norm_forward
// checks), else 1: scalar bf16 loads leave most of the memory bandwidth unused (docs/gpu.md,
// "Measurements behind the CUDA kernels").
template <int V, typename T, typename S>
__global__ void __launch_bounds__(kMaxRowThreads) rmsnorm_forward_rows(NormForwardParams<T, S> p) {
  using A = Acc<T>;
  using P = Pack<T, V>;
  __shared__ A scratch[32];
  const int64_t packs = p.d / V;
  for (int64_t row = blockIdx.x; row < p.n; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(p.x + row * p.d);
    A ss = 0;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      P v = xr[k];
      if (p.a) {
        const P av = reinterpret_cast<const P*>(p.a + row * p.d)[k];
#pragma unroll
        for (int e = 0; e < V; ++e) v.v[e] = from_acc<T>(to_acc<T>(v.v[e]) + to_acc<T>(av.v[e]));
        reinterpret_cast<P*>(p.s + row * p.d)[k] = v;
      }
#pragma unroll
      for (int e = 0; e < V; ++e) ss += to_acc<T>(v.v[e]) * to_acc<T>(v.v[e]);
    }
    if (p.a) xr = reinterpret_cast<const P*>(p.s + row * p.d);  // this thread's packs, just written
    ss = block_sum(ss, scratch);
    const A r = A(1) / acc_sqrt(ss / static_cast<A>(p.d) + p.eps);
    if (threadIdx.x == 0) p.rstd[row] = from_acc<S>(r);
    P* yr = reinterpret_cast<P*>(p.y + row * p.d);
    const P* w = reinterpret_cast<const P*>(p.weight);
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      const P v = xr[k], wk = w[k];
      P out;
#pragma unroll
      for (int e = 0; e < V; ++e) out.v[e] = from_acc<T>(to_acc<T>(v.v[e]) * r * to_acc<T>(wk.v[e]));
      yr[k] = out;
    }
  }
}

// Two passes over the row (mean, then squared deviations), as the CPU does: no cancellation.
template <typename T, typename S>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_forward_rows(NormForwardParams<T, S> p) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < p.n; row += gridDim.x) {
    const T* xr = p.x + row * p.d;
    A s = 0;
    if (p.a) {
      T* sr = p.s + row * p.d;
      for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
        const T v = from_acc<T>(load(xr + i) + load(p.a + row * p.d + i));
        sr[i] = v;
        s += to_acc<T>(v);
      }
      xr = sr;  // later passes read this thread's columns back
    } else {
      for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) s += load(xr + i);
    }
    const A mu = block_sum(s, scratch) / static_cast<A>(p.d);
    A ss = 0;
    for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
      const A dev = load(xr + i) - mu;
      ss += dev * dev;
    }
    ss = block_sum(ss, scratch);
    const A r = A(1) / acc_sqrt(ss / static_cast<A>(p.d) + p.eps);
    if (threadIdx.x == 0) {
      p.mean[row] = from_acc<S>(mu);
      p.rstd[row] = from_acc<S>(r);
    }
    T* yr = p.y + row * p.d;
    for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x)
      yr[i] = from_acc<T>((load(xr + i) - mu) * r * load(p.weight + i) + load(p.bias + i));
  }
}

// --- backward: dx per row ---

// ds + dx for the fused add's backward, dx rounded to T first (see the header comment).
template <typename T>
__device__ __forceinline__ T add_rounded(T ds, Acc<T> dx) {
  return from_acc<T>(to_acc<T>(ds) + to_acc<T>(from_acc<T>(dx)));
}

// dy, x, dx [n,d], weight [d], mean (LayerNorm only) and rstd [n]; fused: ds [n,d] added to dx.
template <typename T, typename S>
struct NormBackwardParams {
  const T* dy;
  const T* ds;  // the gradient reaching s from its other uses, or nullptr
  const T* x;
  const T* weight;
  const S* mean;  // nullptr for RMSNorm
  const S* rstd;
  T* dx;
  int64_t n, d;
};

// xhat = x rstd, g = dy weight: dx = rstd (g - xhat mean(g xhat)). V as in the forward.
template <int V, typename T, typename S>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_backward_dx_rows(NormBackwardParams<T, S> p) {
  using A = Acc<T>;
  using P = Pack<T, V>;
  __shared__ A scratch[32];
  const int64_t packs = p.d / V;
  const P* w = reinterpret_cast<const P*>(p.weight);
  for (int64_t row = blockIdx.x; row < p.n; row += gridDim.x) {
    const P* xr = reinterpret_cast<const P*>(p.x + row * p.d);
    const P* dyr = reinterpret_cast<const P*>(p.dy + row * p.d);
    const A r = load(p.rstd + row);
    A dot = 0;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      const P xv = xr[k], dv = dyr[k], wv = w[k];
#pragma unroll
      for (int e = 0; e < V; ++e)
        dot += to_acc<T>(dv.v[e]) * to_acc<T>(wv.v[e]) * (to_acc<T>(xv.v[e]) * r);
    }
    const A c = block_sum(dot, scratch) / static_cast<A>(p.d);
    P* dxr = reinterpret_cast<P*>(p.dx + row * p.d);
    const P* dsr = p.ds ? reinterpret_cast<const P*>(p.ds + row * p.d) : nullptr;
    for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
      const P xv = xr[k], dv = dyr[k], wv = w[k];
      const P sv = dsr ? dsr[k] : P{};
      P out;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A xhat = to_acc<T>(xv.v[e]) * r;
        const A v = r * (to_acc<T>(dv.v[e]) * to_acc<T>(wv.v[e]) - xhat * c);
        out.v[e] = dsr ? add_rounded(sv.v[e], v) : from_acc<T>(v);
      }
      dxr[k] = out;
    }
  }
}

// xhat = (x - mean) rstd, g = dy weight: dx = rstd (g - mean(g) - xhat mean(g xhat)).
template <typename T, typename S>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_backward_dx_rows(NormBackwardParams<T, S> p) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < p.n; row += gridDim.x) {
    const T* xr = p.x + row * p.d;
    const T* dyr = p.dy + row * p.d;
    const A m = load(p.mean + row), r = load(p.rstd + row);
    A sum_g = 0, sum_gx = 0;
    for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
      const A g = load(dyr + i) * load(p.weight + i);
      sum_g += g;
      sum_gx += g * ((load(xr + i) - m) * r);
    }
    const A c_g = block_sum(sum_g, scratch) / static_cast<A>(p.d);
    const A c_gx = block_sum(sum_gx, scratch) / static_cast<A>(p.d);
    T* dxr = p.dx + row * p.d;
    const T* dsr = p.ds ? p.ds + row * p.d : nullptr;
    for (int64_t i = threadIdx.x; i < p.d; i += blockDim.x) {
      const A xhat = (load(xr + i) - m) * r;
      const A v = r * (load(dyr + i) * load(p.weight + i) - c_g - xhat * c_gx);
      dxr[i] = dsr ? add_rounded(dsr[i], v) : from_acc<T>(v);
    }
  }
}

// --- backward: dweight, dbias (column sums over rows) ---

constexpr int kColTile = 32;  // columns per block: one warp's coalesced row segment
constexpr int kRowLanes = 8;  // warps per block, interleaved over the slab's rows
constexpr int kParamGradThreads = kColTile * kRowLanes;
constexpr int64_t kMaxSlabs = 256;
constexpr int64_t kMinSlabRows = 32;

// Rows are split into `count` consecutive slabs of `rows` rows (the last may be shorter).
struct Slabs {
  int64_t count, rows;
};
Slabs slabs_for(int64_t n) {
  if (n == 0) return {0, 0};
  const int64_t want = std::min(kMaxSlabs, (n + kMinSlabRows - 1) / kMinSlabRows);
  const int64_t rows = (n + want - 1) / want;
  return {(n + rows - 1) / rows, rows};
}

// dy, x [n,d], mean (nullptr for RMSNorm) and rstd [n] -> partial_w (and partial_b) [slabs, d]:
// partial_w[s, j] = sum over the slab's rows of dy xhat, partial_b[s, j] = sum of dy.
template <typename T, typename S>
struct ParamGradParams {
  const T* dy;
  const T* x;
  const S* mean;  // nullptr for RMSNorm (xhat = x rstd)
  const S* rstd;
  Acc<T>* partial_w;
  Acc<T>* partial_b;  // nullptr without a bias
  int64_t n, d, slab_rows;
};

// grid (ceil(d / kColTile), slabs), block (kColTile, kRowLanes). Each thread sums one column
// over every kRowLanes-th row of the slab; the lanes are then added in a fixed order.
template <typename T, typename S>
__global__ void __launch_bounds__(kParamGradThreads)
    norm_param_grad_slab_partials(ParamGradParams<T, S> p) {
  using A = Acc<T>;
  __shared__ A lane_w[kRowLanes][kColTile];
  __shared__ A lane_b[kRowLanes][kColTile];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t lo = int64_t(blockIdx.y) * p.slab_rows, hi = min(p.n, lo + p.slab_rows);
  A w = 0, b = 0;
  if (col < p.d) {
    for (int64_t row = lo + threadIdx.y; row < hi; row += kRowLanes) {
      const A g = load(p.dy + row * p.d + col);
      const A xv = load(p.x + row * p.d + col);
      const A centred = p.mean ? xv - load(p.mean + row) : xv;
      w += g * (centred * load(p.rstd + row));
      b += g;
    }
  }
  lane_w[threadIdx.y][threadIdx.x] = w;
  lane_b[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.d) {
    A tw = 0, tb = 0;
    for (int l = 0; l < kRowLanes; ++l) {
      tw += lane_w[l][threadIdx.x];
      tb += lane_b[l][threadIdx.x];
    }
    const int64_t at = int64_t(blockIdx.y) * p.d + col;
    p.partial_w[at] = tw;
    if (p.partial_b) p.partial_b[at] = tb;
  }
}

// partial [slabs, d] -> out [d] = sum over slabs, in slab order (0 when slabs == 0).
template <typename T>
__global__ void sum_slab_partials(const Acc<T>* partial, int64_t slabs, int64_t d, T* out) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < d;
       j += int64_t(gridDim.x) * blockDim.x) {
    Acc<T> s = 0;
    for (int64_t k = 0; k < slabs; ++k) s += partial[k * d + j];
    out[j] = from_acc<T>(s);
  }
}

// dweight (and dbias when given) [d] = column sums of dy xhat (and dy) over n rows; zeros when
// n == 0.
template <typename T, typename S>
void launch_param_grads(const Tensor& dy, const Tensor& x, const S* mean, const S* rstd,
                        Tensor& dweight, Tensor* dbias) {
  using A = Acc<T>;
  const int64_t n = x.size(0), d = x.size(1);
  cudaStream_t stream = compute_stream();
  const Slabs slabs = slabs_for(n);
  Tensor partial_w, partial_b;  // [slabs, d]
  if (slabs.count > 0) {
    partial_w = Tensor::empty({slabs.count, d}, acc_dtype<T>(), Device::CUDA);
    if (dbias) partial_b = Tensor::empty({slabs.count, d}, acc_dtype<T>(), Device::CUDA);
    ParamGradParams<T, S> p{};
    p.dy = dy.data<T>();
    p.x = x.data<T>();
    p.mean = mean;
    p.rstd = rstd;
    p.partial_w = partial_w.data<A>();
    p.partial_b = dbias ? partial_b.data<A>() : nullptr;
    p.n = n;
    p.d = d;
    p.slab_rows = slabs.rows;
    const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile),
                    static_cast<unsigned>(slabs.count));
    norm_param_grad_slab_partials<<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(p);
    MOD_CUDA_CHECK_LAUNCH();
  }
  const A* pw = slabs.count > 0 ? partial_w.data<A>() : nullptr;
  sum_slab_partials<T><<<grid_for(d), kThreads, 0, stream>>>(pw, slabs.count, d, dweight.data<T>());
  MOD_CUDA_CHECK_LAUNCH();
  if (dbias) {
    const A* pb = slabs.count > 0 ? partial_b.data<A>() : nullptr;
    sum_slab_partials<T>
        <<<grid_for(d), kThreads, 0, stream>>>(pb, slabs.count, d, dbias->data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  }
}

// x, y [N,D], weight (and bias) [D], rstd (and mean) [N]: LayerNorm when `mean` is given, else
// RMSNorm (bias and mean null). Fused with the residual add when `a` is given: s = x + a [N,D]
// is written and normalised.
void norm_forward(const char* kernel, const Tensor& x, const Tensor* a, Tensor* s,
                  const Tensor& weight, const Tensor* bias, double eps, Tensor& y, Tensor* mean,
                  Tensor& rstd) {
  const int64_t n = x.size(0), d = x.size(1);
  if (n == 0 || d == 0) return;
  if (mean) check_same_stats(kernel, *mean, rstd);
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    dispatch_stats<T>(rstd.dtype(), kernel, [&](auto zs) {
      using S = decltype(zs);
      NormForwardParams<T, S> p{};
      p.x = x.data<T>();
      p.a = a ? a->data<T>() : nullptr;
      p.s = s ? s->data<T>() : nullptr;
      p.weight = weight.data<T>();
      p.bias = bias ? bias->data<T>() : nullptr;
      p.y = y.data<T>();
      p.mean = mean ? mean->data<S>() : nullptr;
      p.rstd = rstd.data<S>();
      p.n = n;
      p.d = d;
      p.eps = static_cast<Acc<T>>(eps);
      const unsigned blocks = row_blocks(n);
      const int threads = row_threads(d, kMaxRowThreads);
      constexpr int kWide = static_cast<int>(16 / sizeof(T));
      if (mean)
        layernorm_forward_rows<<<blocks, threads, 0, compute_stream()>>>(p);
      else if (d % kWide == 0 &&
               pack_width(p.x, p.a, p.weight, static_cast<const T*>(p.s),
                          static_cast<const T*>(p.y)) == kWide)
        rmsnorm_forward_rows<kWide><<<blocks, wide_row_threads(d / kWide), 0, compute_stream()>>>(p);
      else
        rmsnorm_forward_rows<1><<<blocks, threads, 0, compute_stream()>>>(p);
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

// dy, x, dx [N,D], weight, dweight (and dbias) [D] (overwritten), rstd (and mean) [N]: LayerNorm
// when `mean` is given, else RMSNorm (mean and dbias null). ds [N,D], when defined, is added to
// dx (the fused add's backward; x is then its sum s).
void norm_backward(const char* kernel, const Tensor& dy, const Tensor& ds, const Tensor& x,
                   const Tensor& weight, const Tensor* mean, const Tensor& rstd, Tensor& dx,
                   Tensor& dweight, Tensor* dbias) {
  const int64_t n = x.size(0), d = x.size(1);
  if (d == 0) return;
  if (mean) check_same_stats(kernel, *mean, rstd);
  dispatch_float(x.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    dispatch_stats<T>(rstd.dtype(), kernel, [&](auto zs) {
      using S = decltype(zs);
      const S* mean_data = mean ? mean->data<S>() : nullptr;
      if (n > 0) {
        NormBackwardParams<T, S> p{};
        p.dy = dy.data<T>();
        p.ds = ds.defined() ? ds.data<T>() : nullptr;
        p.x = x.data<T>();
        p.weight = weight.data<T>();
        p.mean = mean_data;
        p.rstd = rstd.data<S>();
        p.dx = dx.data<T>();
        p.n = n;
        p.d = d;
        const unsigned blocks = row_blocks(n);
        const int threads = row_threads(d, kMaxRowThreads);
        constexpr int kWide = static_cast<int>(16 / sizeof(T));
        if (mean)
          layernorm_backward_dx_rows<<<blocks, threads, 0, compute_stream()>>>(p);
        else if (d % kWide == 0 &&
                 pack_width(p.x, p.dy, p.ds, p.weight, static_cast<const T*>(p.dx)) == kWide)
          rmsnorm_backward_dx_rows<kWide>
              <<<blocks, wide_row_threads(d / kWide), 0, compute_stream()>>>(p);
        else
          rmsnorm_backward_dx_rows<1><<<blocks, threads, 0, compute_stream()>>>(p);
        MOD_CUDA_CHECK_LAUNCH();
      }
      launch_param_grads<T, S>(dy, x, mean_data, rstd.data<S>(), dweight, dbias);
    });
  });
}

}  // namespace

// x, y [N,D], weight [D], rstd [N] (cached for backward).
void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                                  Tensor& rstd) {
  norm_forward("rmsnorm_forward", x, nullptr, nullptr, weight, nullptr, eps, y, nullptr, rstd);
}

// dy, x, dx [N,D], weight, dweight [D] (overwritten), rstd [N].
void CudaBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                   const Tensor& rstd, Tensor& dx, Tensor& dweight) {
  norm_backward("rmsnorm_backward", dy, Tensor(), x, weight, nullptr, rstd, dx, dweight, nullptr);
}

// x, y [N,D], weight, bias [D], mean and rstd [N] (cached for backward).
void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    double eps, Tensor& y, Tensor& mean, Tensor& rstd) {
  norm_forward("layernorm_forward", x, nullptr, nullptr, weight, &bias, eps, y, &mean, rstd);
}

// dy, x, dx [N,D], weight, dweight, dbias [D] (overwritten), mean, rstd [N].
void CudaBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dweight, Tensor& dbias) {
  norm_backward("layernorm_backward", dy, Tensor(), x, weight, &mean, rstd, dx, dweight, &dbias);
}

// x, a, s, y [N,D], weight [D], rstd [N] (cached for backward).
void CudaBackend::add_rmsnorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                      double eps, Tensor& s, Tensor& y, Tensor& rstd) {
  norm_forward("add_rmsnorm_forward", x, &a, &s, weight, nullptr, eps, y, nullptr, rstd);
}

// dy, ds (or undefined), s, dx [N,D], weight, dweight [D] (overwritten), rstd [N].
void CudaBackend::add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                       const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                       Tensor& dweight) {
  norm_backward("add_rmsnorm_backward", dy, ds, s, weight, nullptr, rstd, dx, dweight, nullptr);
}

// x, a, s, y [N,D], weight, bias [D], mean and rstd [N] (cached for backward).
void CudaBackend::add_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                        const Tensor& bias, double eps, Tensor& s, Tensor& y,
                                        Tensor& mean, Tensor& rstd) {
  norm_forward("add_layernorm_forward", x, &a, &s, weight, &bias, eps, y, &mean, rstd);
}

// dy, ds (or undefined), s, dx [N,D], weight, dweight, dbias [D] (overwritten), mean, rstd [N].
void CudaBackend::add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                         const Tensor& weight, const Tensor& mean,
                                         const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                         Tensor& dbias) {
  norm_backward("add_layernorm_backward", dy, ds, s, weight, &mean, rstd, dx, dweight, &dbias);
}

}  // namespace mod::cuda
