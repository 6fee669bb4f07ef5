// CUDA routing kernels for Mixture-of-Depths: row gather, row scatter-add and per-row top-k;
// the semantics of core/cpu/ops/routing.cpp. Shape legend: B batch, T tokens, C selected rows
// per batch entry, D width.
// - gather_rows / scatter_add_rows (and scatter_gated_rows, MoD's gate multiply in the same
//   pass; its backward one warp a row): blocks of (x: columns, y: rows) threads, one row of D per
//   threadIdx.y, so narrow rows (D = 1 for router weights) still fill the block. Gather copies
//   raw 2..16-byte words, so any dtype gathers (integer positions too). Scatter-add uses
//   atomicAdd (bf16 pairs where aligned): an address gets one add per repeat of its index, so
//   the result is bitwise reproducible whenever a row's indices are distinct (the MoD case:
//   they come from top-k); repeated indices add in an unspecified order.
// - topk_rows: two kernels, no host synchronisation. topk_rank_flags ranks each token under
//   (score desc, position asc) against the whole row, tiled through shared memory: one thread
//   per token doing T compares, T/256 blocks per row, T^2 compares per row (67M for T = 8192:
//   small next to the block's attention). A token is selected iff its rank < k; the
//   order is total, so exactly k are. topk_compact_positions then scans the flags in position
//   order (warp ballots), giving each selected token its slot with positions ascending.
// - routing_summary: two single-block kernels over the whole [R,T] (thousands to a million
//   tokens: microseconds), so sums come out in one order and nothing is atomic across blocks;
//   the second counts the histogram, whose bounds need the first's extremes.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid cap; blocks stride over more rows
constexpr unsigned kMaxGridY = 65535;

// --- gather / scatter-add over rows ---

// Block shape for rows of `words` elements: x spans a row (a power of two up to kThreads),
// y = kThreads / x rows per block.
dim3 row_block(int64_t words) {
  unsigned x = 1;
  while (x < static_cast<uint64_t>(words) && x < static_cast<unsigned>(kThreads)) x <<= 1;
  return dim3(x, kThreads / x);
}
unsigned row_grid(int64_t rows, dim3 block) {
  return static_cast<unsigned>(std::min((rows + block.y - 1) / block.y, kMaxBlocks));
}

// Row r of the flattened [B*C] selection reads or writes token row (r / C) * T + idx[r].
template <typename I>
struct RowMap {
  const I* idx;  // [B*C]
  int64_t rows, t, c;
  __device__ int64_t token_row(int64_t r) const {
    return (r / c) * t + static_cast<int64_t>(idx[r]);
  }
};

// x [B*T, words] -> out [B*C, words]: out[r] = x[token_row(r)]. W is a raw word of the rows.
template <typename W, typename I>
__global__ void gather_rows_copy(RowMap<I> m, const W* x, W* out, int64_t words) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < m.rows;
       r += int64_t(gridDim.x) * blockDim.y) {
    const W* from = x + m.token_row(r) * words;
    W* to = out + r * words;
    for (int64_t j = threadIdx.x; j < words; j += blockDim.x) to[j] = from[j];
  }
}

// The widest word (16, 8, 4 or 2 bytes) dividing the row and both base addresses.
template <typename I>
void launch_gather(RowMap<I> m, const void* x, void* out, int64_t row_bytes) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out);
  auto fits = [&](int64_t w) { return row_bytes % w == 0 && addr % w == 0; };
  auto launch = [&](auto word) {
    using W = decltype(word);
    const int64_t words = row_bytes / static_cast<int64_t>(sizeof(W));
    const dim3 block = row_block(words);
    gather_rows_copy<<<row_grid(m.rows, block), block, 0, compute_stream()>>>(
        m, static_cast<const W*>(x), static_cast<W*>(out), words);
    MOD_CUDA_CHECK_LAUNCH();
  };
  if (fits(16))
    launch(uint4{});
  else if (fits(8))
    launch(uint2{});
  else if (fits(4))
    launch(uint32_t{});
  else
    launch(uint16_t{});
}

// src's row times the gate, rounded to the row's dtype as mul rounds it.
template <typename T>
__device__ __forceinline__ T gated(T v, Acc<T> g) {
  return from_acc<T>(to_acc(v) * g);
}
__device__ __forceinline__ __nv_bfloat162 gated(__nv_bfloat162 v, float g) {
  return __floats2bfloat162_rn(__low2float(v) * g, __high2float(v) * g);
}

// out [B*T, d] += src [B*C, d] at token_row(r), each row first times gate[r] when a gate is
// given. E is T, or a bf16 pair (d then counts pairs) with G bf16.
template <typename E, typename G, typename I>
__global__ void scatter_add_rows_atomic(RowMap<I> m, const E* src, const G* gate, E* out,
                                        int64_t d) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < m.rows;
       r += int64_t(gridDim.x) * blockDim.y) {
    E* to = out + m.token_row(r) * d;
    const E* from = src + r * d;
    if (!gate) {
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(to + j, from[j]);
    } else {
      const Acc<G> g = to_acc(gate[r]);
      for (int64_t j = threadIdx.x; j < d; j += blockDim.x) atomicAdd(to + j, gated(from[j], g));
    }
  }
}

template <typename E, typename G, typename I>
void launch_scatter_add(RowMap<I> m, const E* src, const G* gate, E* out, int64_t d) {
  const dim3 block = row_block(d);
  scatter_add_rows_atomic<<<row_grid(m.rows, block), block, 0, compute_stream()>>>(m, src, gate,
                                                                                   out, d);
  MOD_CUDA_CHECK_LAUNCH();
}

// scatter_add_rows (gate undefined) and scatter_gated_rows: idx [B,C], src [B,C,D], gate
// [B,C,1], out [B,T,D].
void scatter_rows(const Tensor& idx, const Tensor& src, const Tensor* gate, Tensor& out,
                  const char* kernel) {
  const int64_t b = out.size(0), t = out.size(1), d = out.size(2), c = idx.size(1);
  if (b * c * d == 0) return;
  dispatch_float(out.dtype(), kernel, [&](auto z) {
    using T = decltype(z);
    dispatch_index(idx.dtype(), kernel, [&](auto zi) {
      using I = decltype(zi);
      const RowMap<I> m{idx.data<I>(), b * c, t, c};
      const T* g = gate ? gate->data<T>() : nullptr;
      if constexpr (std::is_same_v<T, bf16>) {
        // Pairs halve the atomics where rows are whole, 4-byte-aligned bf16x2 words.
        const uintptr_t addr = reinterpret_cast<uintptr_t>(src.raw_data()) |
                               reinterpret_cast<uintptr_t>(out.raw_data());
        if (d % 2 == 0 && addr % 4 == 0) {
          launch_scatter_add(m, src.data<__nv_bfloat162>(), g, out.data<__nv_bfloat162>(), d / 2);
          return;
        }
      }
      launch_scatter_add(m, src.data<T>(), g, out.data<T>(), d);
    });
  });
}

// a * b rounded to the dtype as mul rounds it, in the accumulation type; a bf16 pair's two.
template <typename T>
__device__ __forceinline__ Acc<T> rounded_product(T a, T b) {
  return to_acc(from_acc<T>(to_acc(a) * to_acc(b)));
}
__device__ __forceinline__ float rounded_product(__nv_bfloat162 a, __nv_bfloat162 b) {
  return rounded_product(__low2bfloat16(a), __low2bfloat16(b)) +
         rounded_product(__high2bfloat16(a), __high2bfloat16(b));
}

// One warp a selected row: dsrc[r] = round(gate[r] * dout[token_row(r)]) and dgate[r] = the
// warp's sum of round(dout * src) over the row (each product rounded as mul's backward rounds
// it before summing). dsrc or dgate null: not wanted. E is T, or a bf16 pair (d then counts
// pairs: 4-byte loads, where single bf16 ones left a warp's reads at 64 bytes) with G bf16.
template <typename E, typename G, typename I>
__global__ void scatter_gated_rows_backward_kernel(RowMap<I> m, const E* dout, const E* src,
                                                   const G* gate, E* dsrc, G* dgate, int64_t d) {
  using A = Acc<G>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); r < m.rows;
       r += warps) {
    const E* grad = dout + m.token_row(r) * d;
    const E* s = src + r * d;
    const A g = to_acc(gate[r]);
    A sum = 0;
    for (int64_t c = lane; c < d; c += 32) {
      const E go = grad[c];
      if (dsrc) dsrc[r * d + c] = gated(go, g);
      if (dgate) sum += rounded_product(go, s[c]);
    }
    if (dgate) {
      sum = warp_sum(sum);
      if (lane == 0) dgate[r] = from_acc<G>(sum);
    }
  }
}

template <typename E, typename G, typename I>
void launch_scatter_gated_backward(RowMap<I> m, const E* dout, const E* src, const G* gate,
                                   E* dsrc, G* dgate, int64_t d) {
  constexpr int64_t kWarps = kThreads / 32;
  const auto blocks = static_cast<unsigned>(std::min((m.rows + kWarps - 1) / kWarps, kMaxBlocks));
  scatter_gated_rows_backward_kernel<<<blocks, kThreads, 0, compute_stream()>>>(m, dout, src, gate,
                                                                                dsrc, dgate, d);
  MOD_CUDA_CHECK_LAUNCH();
}

// --- top-k ---

// Unsigned keys ordered like the scores: -0 ties with +0 (as the CPU's == does) and NaN sorts
// below -inf, NaNs tied by position: the CPU's order.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v != v) return 0u;
  const uint32_t u = v == 0.0f ? 0u : __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ uint64_t order_key(double v) {
  if (v != v) return 0ull;
  const uint64_t u = v == 0.0 ? 0ull : static_cast<uint64_t>(__double_as_longlong(v));
  return (u & 0x8000000000000000ull) ? ~u : (u | 0x8000000000000000ull);
}
template <typename T>
using OrderKey = decltype(order_key(Acc<T>{}));

// scores [b,t] -> flags [b,t] (1 iff selected). grid (ceil(t / kThreads), min(b, 65535)),
// block kThreads: each block ranks kThreads consecutive tokens of a row against the whole row,
// read kThreads keys at a time through shared memory. Tiles before the block's own tokens
// count ties as better (lower position), tiles after do not; only the own tile compares
// positions, so the branch is uniform over the block.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    topk_rank_flags(const T* scores, int64_t b, int64_t t, int64_t k, int32_t* flags) {
  using K = OrderKey<T>;
  __shared__ K tile[kThreads];
  const int64_t first = int64_t(blockIdx.x) * kThreads, pos = first + threadIdx.x;
  for (int64_t row = blockIdx.y; row < b; row += gridDim.y) {
    const T* s = scores + row * t;
    const K mine = pos < t ? order_key(load(s + pos)) : K(0);
    int64_t rank = 0;
    for (int64_t j0 = 0; j0 < t; j0 += kThreads) {
      __syncthreads();  // the previous tile is no longer read
      if (j0 + threadIdx.x < t) tile[threadIdx.x] = order_key(load(s + j0 + threadIdx.x));
      __syncthreads();
      const int len = static_cast<int>(min(int64_t{kThreads}, t - j0));
      int count = 0;
      if (j0 < first) {
        for (int i = 0; i < len; ++i) count += tile[i] >= mine;
      } else if (j0 > first) {
        for (int i = 0; i < len; ++i) count += tile[i] > mine;
      } else {
        for (int i = 0; i < len; ++i)
          count += tile[i] > mine || (tile[i] == mine && i < static_cast<int>(threadIdx.x));
      }
      rank += count;
    }
    if (pos < t) flags[row * t + pos] = rank < k ? 1 : 0;
  }
}

// flags [b,t] -> idx [b,k]: the selected positions in ascending order. One block of kThreads
// per row walks the row in chunks; a selected token's slot = selected tokens before it.
__global__ void __launch_bounds__(kThreads)
    topk_compact_positions(const int32_t* flags, int64_t b, int64_t t, int64_t k, int64_t* idx) {
  constexpr int kWarps = kThreads / 32;
  __shared__ int warp_counts[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t row = blockIdx.x; row < b; row += gridDim.x) {
    int64_t base = 0;  // selected tokens in earlier chunks
    for (int64_t t0 = 0; t0 < t; t0 += kThreads) {
      const int64_t pos = t0 + threadIdx.x;
      const bool selected = pos < t && flags[row * t + pos] != 0;
      const unsigned ballot = __ballot_sync(0xffffffffu, selected);
      if (lane == 0) warp_counts[warp] = __popc(ballot);
      __syncthreads();
      int before = __popc(ballot & ((1u << lane) - 1u)), total = 0;
      for (int w = 0; w < kWarps; ++w) {
        if (w < warp) before += warp_counts[w];
        total += warp_counts[w];
      }
      const int64_t slot = base + before;
      if (selected && slot < k) idx[row * k + slot] = pos;
      base += total;
      __syncthreads();  // warp_counts is rewritten by the next chunk
    }
  }
}

}  // namespace

// x [B,T,D], idx [B,C], out [B,C,D]: out[b,c] = x[b, idx[b,c]]. A pure copy of raw words, so
// every dtype gathers, integer rows (token positions) included.
void CudaBackend::gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) {
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), c = idx.size(1);
  if (b * c * d == 0) return;
  const int64_t row_bytes = d * static_cast<int64_t>(dtype_size(x.dtype()));
  dispatch_index(idx.dtype(), "gather_rows", [&](auto zi) {
    using I = decltype(zi);
    launch_gather(RowMap<I>{idx.data<I>(), b * c, t, c}, x.raw_data(), out.raw_data(), row_bytes);
  });
}

// idx [B,C], src [B,C,D], out [B,T,D]: out[b, idx[b,c]] += src[b,c] (repeats accumulate).
void CudaBackend::scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) {
  scatter_rows(idx, src, nullptr, out, "scatter_add_rows");
}

// idx [B,C], src [B,C,D], gate [B,C,1], out [B,T,D]: out[b, idx[b,c]] += round(gate * src).
void CudaBackend::scatter_gated_rows(const Tensor& idx, const Tensor& src, const Tensor& gate,
                                     Tensor& out) {
  scatter_rows(idx, src, &gate, out, "scatter_gated_rows");
}

void CudaBackend::scatter_gated_rows_backward(const Tensor& dout, const Tensor& idx,
                                              const Tensor& src, const Tensor& gate, Tensor& dsrc,
                                              Tensor& dgate) {
  const int64_t b = dout.size(0), t = dout.size(1), d = dout.size(2), c = idx.size(1);
  if (b * c == 0 || (!dsrc.defined() && !dgate.defined())) return;
  if (d == 0) {  // no columns: every row sum is 0
    if (dgate.defined()) fill(dgate, 0.0);
    return;
  }
  dispatch_float(dout.dtype(), "scatter_gated_rows_backward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(idx.dtype(), "scatter_gated_rows_backward", [&](auto zi) {
      using I = decltype(zi);
      const RowMap<I> m{idx.data<I>(), b * c, t, c};
      T* ds = dsrc.defined() ? dsrc.data<T>() : nullptr;
      T* dg = dgate.defined() ? dgate.data<T>() : nullptr;
      if constexpr (std::is_same_v<T, bf16>) {
        const uintptr_t addr = reinterpret_cast<uintptr_t>(dout.raw_data()) |
                               reinterpret_cast<uintptr_t>(src.raw_data()) |
                               reinterpret_cast<uintptr_t>(ds);
        if (d % 2 == 0 && addr % 4 == 0) {
          using P = __nv_bfloat162;
          launch_scatter_gated_backward(m, dout.data<P>(), src.data<P>(), gate.data<T>(),
                                        reinterpret_cast<P*>(ds), dg, d / 2);
          return;
        }
      }
      launch_scatter_gated_backward(m, dout.data<T>(), src.data<T>(), gate.data<T>(), ds, dg, d);
    });
  });
}

// scores [B,T] -> idx [B,k] (i64), positions ascending; ties to the lower position.
void CudaBackend::topk_rows(const Tensor& scores, int64_t k, Tensor& idx) {
  const int64_t b = scores.size(0), t = scores.size(1);
  if (b == 0 || t == 0 || k == 0) return;
  dispatch_float(scores.dtype(), "topk_rows", [&](auto z) {
    using T = decltype(z);
    Tensor flags = Tensor::empty({b, t}, DType::I32, Device::CUDA);
    const dim3 grid(static_cast<unsigned>((t + kThreads - 1) / kThreads),
                    static_cast<unsigned>(std::min<int64_t>(b, kMaxGridY)));
    topk_rank_flags<<<grid, kThreads, 0, compute_stream()>>>(scores.data<T>(), b, t, k,
                                                             flags.data<int32_t>());
    MOD_CUDA_CHECK_LAUNCH();
    topk_compact_positions<<<static_cast<unsigned>(std::min(b, kMaxBlocks)), kThreads, 0,
                             compute_stream()>>>(flags.data<int32_t>(), b, t, k,
                                                 idx.data<int64_t>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

namespace {
constexpr int kSummaryThreads = 1024;

// block_sum's counterpart for min and max: op over the block (blockDim.x a multiple of 32,
// converged); every thread gets lane 0's result.
template <typename A, typename Op>
__device__ A block_reduce(A v, A identity, A* scratch, Op op) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? scratch[lane] : identity;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return __shfl_sync(0xffffffffu, v, 0);
}

struct Min {
  __device__ double operator()(double a, double b) const { return fmin(a, b); }
};
struct Max {
  __device__ double operator()(double a, double b) const { return fmax(a, b); }
};

// r, decision, member [n] in rows of t -> out[kSum .. kHistogram).
template <typename T>
__global__ void __launch_bounds__(kSummaryThreads)
    routing_summary_counts(const T* r, const T* decision, const T* member, int64_t n, int64_t t,
                           double* out) {
  using S = RoutingSummary;
  __shared__ double scratch[32];
  __shared__ unsigned long long by_bucket[S::kPositionBuckets];
  if (threadIdx.x < S::kPositionBuckets) by_bucket[threadIdx.x] = 0;
  __syncthreads();
  double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY, tp = 0, fp = 0, fn = 0, correct = 0;
  int64_t pos = threadIdx.x % t;  // advanced by additions: a 64-bit division per element costs
  const int64_t step = blockDim.x % t;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = static_cast<double>(load(r + i));
    sum += v;
    sq += v * v;
    lo = fmin(lo, v);
    hi = fmax(hi, v);
    const bool said = load(decision + i) > 0, is = load(member + i) > 0.5f;
    tp += said && is;
    fp += said && !is;
    fn += !said && is;
    correct += said == is;
    if (is) atomicAdd(&by_bucket[pos * S::kPositionBuckets / t], 1ull);
    pos += step;
    if (pos >= t) pos -= t;
  }
  sum = block_sum(sum, scratch);
  sq = block_sum(sq, scratch);
  lo = block_reduce(lo, double(INFINITY), scratch, Min());
  hi = block_reduce(hi, -double(INFINITY), scratch, Max());
  tp = block_sum(tp, scratch);
  fp = block_sum(fp, scratch);
  fn = block_sum(fn, scratch);
  correct = block_sum(correct, scratch);
  __syncthreads();  // by_bucket complete
  if (threadIdx.x == 0) {
    out[S::kSum] = sum;
    out[S::kSumSquares] = sq;
    out[S::kMin] = lo;
    out[S::kMax] = hi;
    out[S::kTruePositive] = tp;
    out[S::kFalsePositive] = fp;
    out[S::kFalseNegative] = fn;
    out[S::kCorrect] = correct;
  }
  if (threadIdx.x < S::kPositionBuckets)
    out[S::kMembersByBucket + threadIdx.x] = static_cast<double>(by_bucket[threadIdx.x]);
}

// The histogram of r [n] between out[kMin] and out[kMax], bucketed as util::histogram_bucket
// does over util::histogram_upper_bounds (fma for the bounds there and here: the same doubles).
template <typename T>
__global__ void __launch_bounds__(kSummaryThreads)
    routing_summary_histogram(const T* r, int64_t n, double* out) {
  using S = RoutingSummary;
  __shared__ double upper[S::kHistogramBuckets];
  __shared__ unsigned int count[S::kHistogramBuckets];
  const double lo = out[S::kMin], hi = out[S::kMax];
  const int buckets = hi > lo ? S::kHistogramBuckets : 1;
  const double width = (hi - lo) / buckets;
  if (threadIdx.x < S::kHistogramBuckets) {
    upper[threadIdx.x] =
        static_cast<int>(threadIdx.x) + 1 == buckets ? hi : fma(width, threadIdx.x + 1.0, lo);
    count[threadIdx.x] = 0;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = static_cast<double>(load(r + i));
    int k = width > 0 ? min(max(static_cast<int>((v - lo) / width), 0), buckets - 1) : 0;
    while (k > 0 && v <= upper[k - 1]) --k;
    while (k < buckets - 1 && v > upper[k]) ++k;
    atomicAdd(&count[k], 1u);
  }
  __syncthreads();
  if (threadIdx.x < S::kHistogramBuckets)
    out[S::kHistogram + threadIdx.x] =
        static_cast<int>(threadIdx.x) < buckets ? static_cast<double>(count[threadIdx.x]) : 0.0;
}
}  // namespace

// r, decision, member [R,T] (one float dtype) -> out f64 [RoutingSummary::kSize].
void CudaBackend::routing_summary(const Tensor& r, const Tensor& decision, const Tensor& member,
                                  Tensor& out) {
  RoutingSummary::check(r, decision, member, out);
  const int64_t n = r.numel(), t = r.size(-1);
  dispatch_float(r.dtype(), "routing_summary", [&](auto z) {
    using T = decltype(z);
    routing_summary_counts<<<1, kSummaryThreads, 0, compute_stream()>>>(
        r.data<T>(), decision.data<T>(), member.data<T>(), n, t, out.data<double>());
    MOD_CUDA_CHECK_LAUNCH();
    routing_summary_histogram<<<1, kSummaryThreads, 0, compute_stream()>>>(r.data<T>(), n,
                                                                          out.data<double>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
