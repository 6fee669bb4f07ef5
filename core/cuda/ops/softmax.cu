// CUDA softmax over rows [N,V], logsumexp and the fused softmax + cross-entropy: the math of
// core/cpu/ops/softmax.cpp in Acc<T>. Work split: one block per row (grid-stride over rows),
// its threads striding the row in coalesced chunks, because V reaches a 50k vocabulary while N
// can be small. Row statistics come from one pass over memory: each thread keeps an online
// (max, sum of exp(x - max)) pair, one exp per element, and the pairs are merged across the
// block. Cross-entropy caches lse [N] (in logits' dtype, or f32 for bf16 logits) and its
// backward recomputes the probabilities from it. Cross-entropy runs one warp per row instead,
// with 16-byte loads, several in flight: its rows are many (every token of the batch) and one
// block a row waited on one scalar load after another, far below the memory bandwidth. The
// fused classifier's row (cross_entropy_with_dlogits) walks its row so too, twice: statistics,
// then dlogits written over the logits in place (llm.c's fused_classifier).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {

constexpr int kMaxRowThreads = 1024;

// max over the elements seen and sum of exp(x - max) over them.
template <typename A>
struct MaxSum {
  A max, sum;
};

// exp(m - to), where to >= m; equal values (infinities included) give 1, not exp(NaN).
template <typename A>
__device__ __forceinline__ A rescale(A m, A to) {
  return m == to ? A(1) : acc_exp(m - to);
}

// Adds one element: one exp whichever branch. A NaN element makes the sum NaN.
template <typename A>
__device__ __forceinline__ void push(MaxSum<A>& st, A x) {
  if (x > st.max) {
    st.sum = st.sum * rescale(st.max, x) + A(1);
    st.max = x;
  } else {
    st.sum += rescale(x, st.max);
  }
}

template <typename A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * rescale(a.max, m) + b.sum * rescale(b.max, m)};
}

template <typename A>
__device__ __forceinline__ MaxSum<A> warp_max_sum(MaxSum<A> v) {
  for (int o = 16; o > 0; o >>= 1) {
    const MaxSum<A> other{__shfl_xor_sync(0xffffffffu, v.max, o),
                          __shfl_xor_sync(0xffffffffu, v.sum, o)};
    v = merge(v, other);
  }
  return v;
}

// Merge over the block (as block_sum: blockDim.x a multiple of 32, converged block); every
// thread gets the result. scratch_max and scratch_sum hold 32 values each in shared memory.
template <typename A>
__device__ MaxSum<A> block_max_sum(MaxSum<A> v, A* scratch_max, A* scratch_sum) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max_sum(v);
  __syncthreads();
  if (lane == 0) {
    scratch_max[warp] = v.max;
    scratch_sum[warp] = v.sum;
  }
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? MaxSum<A>{scratch_max[lane], scratch_sum[lane]} : MaxSum<A>{-INFINITY, A(0)};
  v = warp_max_sum(v);
  // Lanes may round the butterfly's sums differently (FMA contraction); every thread takes
  // lane 0's, so all elements of the row are normalised by the same value.
  return {__shfl_sync(0xffffffffu, v.max, 0), __shfl_sync(0xffffffffu, v.sum, 0)};
}

// The statistics of row [v], returned to every thread of the block.
template <typename T>
__device__ MaxSum<Acc<T>> row_max_sum(const T* row, int64_t v, Acc<T>* scratch_max,
                                      Acc<T>* scratch_sum) {
  MaxSum<Acc<T>> st{-INFINITY, Acc<T>(0)};
  for (int64_t i = threadIdx.x; i < v; i += blockDim.x) push(st, load(row + i));
  return block_max_sum(st, scratch_max, scratch_sum);
}

// x, y [n,v]: y = exp(x - max) / sum per row.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_forward_rows(const T* x, T* y, int64_t n, int64_t v) {
  using A = Acc<T>;
  __shared__ A scratch_max[32], scratch_sum[32];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* xr = x + row * v;
    const MaxSum<A> st = row_max_sum(xr, v, scratch_max, scratch_sum);
    const A inv = A(1) / st.sum;
    T* yr = y + row * v;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x)
      yr[i] = from_acc<T>(acc_exp(load(xr + i) - st.max) * inv);
  }
}

// y, dy, dx [n,v]: dx = y (dy - sum(y dy)) per row.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t n, int64_t v) {
  using A = Acc<T>;
  __shared__ A scratch[32];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* yr = y + row * v;
    const T* dyr = dy + row * v;
    A dot = 0;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x) dot += load(yr + i) * load(dyr + i);
    const A c = block_sum(dot, scratch);
    T* dxr = dx + row * v;
    for (int64_t i = threadIdx.x; i < v; i += blockDim.x)
      dxr[i] = from_acc<T>(load(yr + i) * (load(dyr + i) - c));
  }
}

// x [n,v], out [n]: max + log(sum); a row whose max is +-inf gives that max.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    logsumexp_rows(const T* x, T* out, int64_t n, int64_t v) {
  using A = Acc<T>;
  __shared__ A scratch_max[32], scratch_sum[32];
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const MaxSum<A> st = row_max_sum(x + row * v, v, scratch_max, scratch_sum);
    if (threadIdx.x == 0) out[row] = from_acc<T>(isinf(st.max) ? st.max : st.max + acc_log(st.sum));
  }
}

// Rows of cross-entropy: kRowWarps rows a block, one warp each, kUnroll packs a lane in flight.
constexpr int kRowWarps = 8;
constexpr int kUnroll = 4;

// Adds a pack of values: one rescale for the pack, then one exp per element (rescale keeps
// equal infinities at 1). A NaN element never becomes the max and makes the sum NaN.
template <typename A, int V>
__device__ __forceinline__ void push_pack(MaxSum<A>& st, const A (&x)[V]) {
  A m = st.max;
#pragma unroll
  for (int e = 0; e < V; ++e) m = x[e] > m ? x[e] : m;
  A sum = st.sum * rescale(st.max, m);
#pragma unroll
  for (int e = 0; e < V; ++e) sum += rescale(x[e], m);
  st = {m, sum};
}

// The statistics of row [v], walked by one warp; every lane gets lane 0's result. Packs of 16
// bytes where the row is aligned to them, then the tail (or the whole row) one element a lane.
template <typename T>
__device__ MaxSum<Acc<T>> warp_row_max_sum(const T* row, int64_t v) {
  using A = Acc<T>;
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  MaxSum<A> st{-INFINITY, A(0)};
  int64_t scalar_from = 0;
  if (reinterpret_cast<uintptr_t>(row) % 16 == 0) {
    const auto* packs = reinterpret_cast<const Pack<T, V>*>(row);
    const int64_t n = v / V;
    int64_t p = lane;
    for (; p + 32 * (kUnroll - 1) < n; p += 32 * kUnroll) {
      Pack<T, V> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = packs[p + 32 * u];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        A a[V];
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] = to_acc<T>(x[u].v[e]);
        push_pack(st, a);
      }
    }
    for (; p < n; p += 32) {
      const Pack<T, V> x = packs[p];
      A a[V];
#pragma unroll
      for (int e = 0; e < V; ++e) a[e] = to_acc<T>(x.v[e]);
      push_pack(st, a);
    }
    scalar_from = n * V;
  }
  for (int64_t i = scalar_from + lane; i < v; i += 32) push(st, load(row + i));
  st = warp_max_sum(st);
  return {__shfl_sync(0xffffffffu, st.max, 0), __shfl_sync(0xffffffffu, st.sum, 0)};
}

// out[i] = f(x[i], i) for one row of v elements by one warp: 16-byte packs where both pointers
// allow, kUnroll packs a lane in flight, then the tail element by element. out may be in: each
// lane reads its elements before it writes them.
template <typename T, typename F>
__device__ __forceinline__ void warp_row_map(const T* in, T* out, int64_t v, F f) {
  constexpr int V = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  int64_t scalar_from = 0;
  if ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) % 16 == 0) {
    const auto* src = reinterpret_cast<const Pack<T, V>*>(in);
    auto* dst = reinterpret_cast<Pack<T, V>*>(out);
    const int64_t n = v / V;
    int64_t q = lane;
    for (; q + 32 * (kUnroll - 1) < n; q += 32 * kUnroll) {
      Pack<T, V> x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) x[u] = src[q + 32 * u];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        Pack<T, V> d;
#pragma unroll
        for (int e = 0; e < V; ++e) d.v[e] = f(to_acc<T>(x[u].v[e]), (q + 32 * u) * V + e);
        dst[q + 32 * u] = d;
      }
    }
    for (; q < n; q += 32) {
      const Pack<T, V> x = src[q];
      Pack<T, V> d;
#pragma unroll
      for (int e = 0; e < V; ++e) d.v[e] = f(to_acc<T>(x.v[e]), q * V + e);
      dst[q] = d;
    }
    scalar_from = n * V;
  }
  for (int64_t i = scalar_from + lane; i < v; i += 32) out[i] = f(load(in + i), i);
}

// logits [n,v], targets [n], losses and lse [n]. Ignored rows: loss 0, lse still written. The
// loss uses the unrounded lse; the cache is S (T, or f32 for bf16 logits).
template <typename T, typename I, typename S>
struct CrossEntropyParams {
  const T* logits;
  const I* targets;
  const S* lse;    // backward: the forward's cache
  const T* scale;  // backward: the 0-d factor of every dlogit
  T* out;          // forward: losses [n]; backward: dlogits [n,v]
  S* lse_out;      // forward: lse [n]
  int64_t n, v, ignore_index;
  int64_t vocab_start;  // backward: the slice's first id (vocabulary-parallel loss)
};

// This thread's warp: its first row and the stride over rows.
__device__ __forceinline__ int64_t first_warp_row() {
  return (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5;
}
__device__ __forceinline__ int64_t warp_row_stride() {
  return (int64_t(gridDim.x) * blockDim.x) >> 5;
}

template <typename T, typename I, typename S>
__global__ void __launch_bounds__(kRowWarps * 32)
    cross_entropy_forward_rows(CrossEntropyParams<T, I, S> p) {
  using A = Acc<T>;
  for (int64_t row = first_warp_row(); row < p.n; row += warp_row_stride()) {
    const T* xr = p.logits + row * p.v;
    const MaxSum<A> st = warp_row_max_sum(xr, p.v);
    if ((threadIdx.x & 31) == 0) {
      const A l = st.max + acc_log(st.sum);
      const int64_t t = static_cast<int64_t>(p.targets[row]);
      p.lse_out[row] = from_acc<S>(l);
      p.out[row] = t == p.ignore_index ? from_acc<T>(A(0)) : from_acc<T>(l - load(xr + t));
    }
  }
}

// dlogits = scale (exp(x - lse) - onehot(t - vocab_start)); zero rows where t ==
// ignore_index. A bf16 lse cache is too coarse for exp(x - lse) (its spacing is 1/16 near 10, a
// 3% error in every probability), so then the row's lse is recomputed: one more read of the row
// (the host refuses a bf16 lse for a vocabulary slice, whose row is not all here).
template <typename T, typename I, typename S>
__global__ void __launch_bounds__(kRowWarps * 32)
    cross_entropy_backward_rows(CrossEntropyParams<T, I, S> p) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31;
  const A scale = load(p.scale);
  for (int64_t row = first_warp_row(); row < p.n; row += warp_row_stride()) {
    const T* xr = p.logits + row * p.v;
    T* dr = p.out + row * p.v;
    const int64_t t = static_cast<int64_t>(p.targets[row]);
    if (t == p.ignore_index) {
      for (int64_t i = lane; i < p.v; i += 32) dr[i] = from_acc<T>(A(0));
      continue;
    }
    A l;
    if constexpr (std::is_same_v<S, bf16>) {
      const MaxSum<A> st = warp_row_max_sum(xr, p.v);
      l = st.max + acc_log(st.sum);
    } else {
      l = load(p.lse + row);
    }
    const int64_t local = t - p.vocab_start;  // outside [0, v): no onehot term here
    auto dlogit = [&](A x, int64_t i) {
      return from_acc<T>(scale * acc_exp(x - l) - (i == local ? scale : A(0)));
    };
    warp_row_map(xr, dr, p.v, dlogit);
  }
}

// The fused classifier's row (core/ops/loss.h): logits [n,v] are read for the statistics, then
// overwritten with dlogits = scale (exp(x - lse) - onehot(t)) (a zero row where ignored) when
// scale is non-null; losses [n] and scale in S (f32 for bf16 logits). Every lane reads the
// target's logit before the warp writes the row.
template <typename T, typename I, typename S>
struct CrossEntropyDlogitsParams {
  T* logits;
  const I* targets;
  const S* scale;  // null: the loss alone
  S* losses;
  int64_t n, v, ignore_index;
};

template <typename T, typename I, typename S>
__global__ void __launch_bounds__(kRowWarps * 32)
    cross_entropy_with_dlogits_rows(CrossEntropyDlogitsParams<T, I, S> p) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31;
  for (int64_t row = first_warp_row(); row < p.n; row += warp_row_stride()) {
    T* xr = p.logits + row * p.v;
    const MaxSum<A> st = warp_row_max_sum(xr, p.v);
    const A l = st.max + acc_log(st.sum);
    const int64_t t = static_cast<int64_t>(p.targets[row]);
    const bool ignored = t == p.ignore_index;
    const A xt = ignored ? A(0) : load(xr + t);
    if (lane == 0) p.losses[row] = static_cast<S>(ignored ? A(0) : l - xt);
    if (p.scale == nullptr) continue;
    __syncwarp();  // xr[t] is read by every lane before any lane overwrites it
    const A scale = static_cast<A>(*p.scale);
    if (ignored) {
      for (int64_t i = lane; i < p.v; i += 32) xr[i] = from_acc<T>(A(0));
      continue;
    }
    auto dlogit = [&](A x, int64_t i) {
      return from_acc<T>(scale * acc_exp(x - l) - (i == t ? scale : A(0)));
    };
    warp_row_map(xr, xr, p.v, dlogit);
  }
}

}  // namespace

// x, y [N,V].
void CudaBackend::softmax_forward(const Tensor& x, Tensor& y) {
  const int64_t n = x.size(0), v = x.size(1);
  if (n == 0 || v == 0) return;
  dispatch_float(x.dtype(), "softmax_forward", [&](auto z) {
    using T = decltype(z);
    softmax_forward_rows<<<row_blocks(n), row_threads(v, kMaxRowThreads), 0, compute_stream()>>>(
        x.data<T>(), y.data<T>(), n, v);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

// y (the forward's output), dy, dx [N,V].
void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const int64_t n = y.size(0), v = y.size(1);
  if (n == 0 || v == 0) return;
  dispatch_float(y.dtype(), "softmax_backward", [&](auto z) {
    using T = decltype(z);
    softmax_backward_rows<<<row_blocks(n), row_threads(v, kMaxRowThreads), 0, compute_stream()>>>(
        y.data<T>(), dy.data<T>(), dx.data<T>(), n, v);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

// x [N,V] (V > 0), out [N].
void CudaBackend::logsumexp_forward(const Tensor& x, Tensor& out) {
  const int64_t n = x.size(0), v = x.size(1);
  if (n == 0 || v == 0) return;
  dispatch_float(x.dtype(), "logsumexp_forward", [&](auto z) {
    using T = decltype(z);
    logsumexp_rows<<<row_blocks(n), row_threads(v, kMaxRowThreads), 0, compute_stream()>>>(
        x.data<T>(), out.data<T>(), n, v);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

namespace {
// The launch both directions share: forward writes losses (out [N]) and lse [N]; backward reads
// lse and writes dlogits (out [N,V]), from vocab_start's slice, times the 0-d scale.
void launch_cross_entropy(bool backward, const char* kernel, const Tensor& logits,
                          const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                          int64_t vocab_start, const Tensor* scale, Tensor& out) {
  const int64_t n = logits.size(0), v = logits.size(1);
  dispatch_float(logits.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), kernel, [&](auto zi) {
      using I = decltype(zi);
      dispatch_stats<T>(lse.dtype(), kernel, [&](auto zs) {
        using S = decltype(zs);
        CrossEntropyParams<T, I, S> p{};
        p.logits = logits.data<T>();
        p.targets = targets.data<I>();
        p.out = out.data<T>();
        p.n = n;
        p.v = v;
        p.ignore_index = ignore_index;
        const unsigned blocks = row_blocks((n + kRowWarps - 1) / kRowWarps);
        const int threads = kRowWarps * 32;
        if (backward) {
          p.lse = lse.data<S>();
          p.scale = scale->data<T>();
          p.vocab_start = vocab_start;
          cross_entropy_backward_rows<<<blocks, threads, 0, compute_stream()>>>(p);
        } else {
          p.lse_out = lse.data<S>();
          cross_entropy_forward_rows<<<blocks, threads, 0, compute_stream()>>>(p);
        }
        MOD_CUDA_CHECK_LAUNCH();
      });
    });
  });
}
}  // namespace

// logits [N,V], targets [N] (in range or ignore_index, checked by the caller), losses, lse [N].
void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                        int64_t ignore_index, Tensor& losses, Tensor& lse) {
  if (logits.size(0) == 0 || logits.size(1) == 0) return;
  launch_cross_entropy(false, "cross_entropy_forward", logits, targets, lse, ignore_index, 0,
                       nullptr, losses);
}

// logits, dlogits [N,V], targets, lse [N], scale [].
void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                         const Tensor& lse, int64_t ignore_index,
                                         int64_t vocab_start, const Tensor& scale,
                                         Tensor& dlogits) {
  if (logits.size(0) == 0 || logits.size(1) == 0) return;
  if (vocab_start != 0 && lse.dtype() == DType::BF16)
    throw std::invalid_argument("cross_entropy_backward: a vocabulary slice needs an f32 or f64 "
                                "lse (a bf16 one would be recomputed from this slice alone)");
  launch_cross_entropy(true, "cross_entropy_backward", logits, targets, lse, ignore_index,
                       vocab_start, &scale, dlogits);
}

// logits [N,V] (dlogits on return when scale is defined), targets [N], scale [], losses [N].
void CudaBackend::cross_entropy_with_dlogits(Tensor& logits, const Tensor& targets,
                                             int64_t ignore_index, const Tensor& scale,
                                             Tensor& losses) {
  const int64_t n = logits.size(0), v = logits.size(1);
  if (n == 0 || v == 0) return;
  const char* kernel = "cross_entropy_with_dlogits";
  dispatch_float(logits.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), kernel, [&](auto zi) {
      using I = decltype(zi);
      dispatch_stats<T>(losses.dtype(), kernel, [&](auto zs) {
        using S = decltype(zs);
        if (scale.defined() && scale.dtype() != losses.dtype())
          throw std::invalid_argument(std::string(kernel) + ": scale must be " +
                                      dtype_name(losses.dtype()) + " as losses are, got " +
                                      dtype_name(scale.dtype()));
        CrossEntropyDlogitsParams<T, I, S> p{};
        p.logits = logits.data<T>();
        p.targets = targets.data<I>();
        p.scale = scale.defined() ? scale.data<S>() : nullptr;
        p.losses = losses.data<S>();
        p.n = n;
        p.v = v;
        p.ignore_index = ignore_index;
        cross_entropy_with_dlogits_rows<<<row_blocks((n + kRowWarps - 1) / kRowWarps),
                                          kRowWarps * 32, 0, compute_stream()>>>(p);
        MOD_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

namespace {
// One block counts every target (a few thousand to a million ids: microseconds) and writes
// 1 / count, so the mean never needs the count on the host.
template <typename I, typename T>
__global__ void inverse_target_count_kernel(const I* targets, int64_t n, int64_t ignore_index,
                                            T* out) {
  __shared__ unsigned long long scratch[32];
  unsigned long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    count += static_cast<int64_t>(targets[i]) != ignore_index;
  count = block_sum(count, scratch);
  if (threadIdx.x == 0)
    *out = from_acc<T>(static_cast<Acc<T>>(count == 0 ? 0.0 : 1.0 / static_cast<double>(count)));
}
}  // namespace

void CudaBackend::inverse_target_count(const Tensor& targets, int64_t ignore_index, Tensor& out) {
  dispatch_float(out.dtype(), "inverse_target_count", [&](auto z) {
    using T = decltype(z);
    dispatch_index(targets.dtype(), "inverse_target_count", [&](auto zi) {
      using I = decltype(zi);
      inverse_target_count_kernel<<<1, 1024, 0, compute_stream()>>>(
          targets.data<I>(), targets.numel(), ignore_index, out.data<T>());
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mod::cuda
