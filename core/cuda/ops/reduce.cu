// CUDA reductions: sum_all, sum_outer (column sums) and sum_inner (row sums), the semantics of
// core/cpu/ops/reduce.cpp. Every dtype accumulates in double, as the CPU does: the kernels are
// memory-bound, so the wider adds cost nothing and f32/bf16 sums lose one rounding at most.
// Deterministic: no atomics, and every split of the work depends only on the shape, so the
// same input gives the same bits on every run and every GPU.
//   sum_inner  rows up to kWarpRowMax long: a warp per row. Longer rows: a block per row, and
//              when there are too few rows to fill the GPU, a row is split over several blocks
//              that write double partials to scratch, summed by a second warp-per-row pass.
//   sum_all    sum_inner of one row: the same two passes (block partials, then one warp).
//   sum_squares  sum_all with each entry squared (in double) as it is read.
//   sum_outer  32x8 thread tiles: a warp reads 32 adjacent columns of one row (coalesced) and
//              the 8 warps walk interleaved rows; few columns also split the rows over blocks
//              (double partials to scratch, then a column pass), so small widths still fill it.
#include <algorithm>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

// Several resident 256-thread blocks on every SM of a large GPU (8 on 128 SMs): enough to
// saturate HBM.
constexpr int64_t kTargetBlocks = 1024;
// A block's share of a split row: 32 or more elements per thread of a 256-thread block.
constexpr int64_t kMinSplitElements = 8192;
// Rows up to this long get a warp each (64 elements per lane at most).
constexpr int64_t kWarpRowMax = 2048;
constexpr int kWarpsPerBlock = kThreads / 32;
// sum_outer tile: kColTile columns (one warp) by kRowLanes warps walking interleaved rows.
constexpr int kColTile = 32;
constexpr int kRowLanes = kThreads / kColTile;
// sum_outer splits rows over blocks only while each split keeps this many rows.
constexpr int64_t kMinSplitRows = 64;
// Cap on the x dimension of a grid whose kernel loops over the rest.
constexpr int64_t kMaxGridX = 65535 * 8;

template <typename Out>
__device__ __forceinline__ void store_sum(Out* p, double v) {
  if constexpr (std::is_same_v<Out, bf16>)
    *p = __double2bfloat16(v);  // one rounding, as the CPU's static_cast<T>(double)
  else
    *p = static_cast<Out>(v);
}

// The term an entry adds: itself, or its square for sum_squares.
template <bool Square, typename In>
__device__ __forceinline__ double term(const In* p) {
  const double v = static_cast<double>(load(p));
  return Square ? v * v : v;
}

// x [rows, inner] -> out [rows]: warp w of the grid sums rows w, w + warps, ... (of squares when
// Square).
template <bool Square, typename In, typename Out>
__global__ void row_sum_warp(const In* x, int64_t rows, int64_t inner, Out* out) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t r = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows;
       r += warps) {
    const In* row = x + r * inner;
    double acc = 0.0;
    for (int64_t i = lane; i < inner; i += 32) acc += term<Square>(row + i);
    acc = warp_sum(acc);
    if (lane == 0) store_sum(out + r, acc);
  }
}

// x [rows, inner] -> out [rows, splits]: task = r * splits + s sums x[r, lo:hi), the s-th of
// `splits` near-equal ranges of the row, with one block per task.
template <bool Square, typename In, typename Out>
__global__ void row_sum_block(const In* x, int64_t rows, int64_t inner, int splits, Out* out) {
  __shared__ double scratch[32];
  const int64_t tasks = rows * splits;
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    const int64_t r = task / splits, s = task % splits;
    const int64_t lo = inner * s / splits, hi = inner * (s + 1) / splits;
    const In* row = x + r * inner;
    double acc = 0.0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) acc += term<Square>(row + i);
    acc = block_sum(acc, scratch);  // begins with a barrier, so scratch reuse is safe
    if (threadIdx.x == 0) store_sum(out + task, acc);
  }
}

// x [outer, inner] -> out [splits, inner]: block (tile, s) sums the rows of split s for the
// columns of its tile; blockDim = (kColTile, kRowLanes).
template <typename In, typename Out>
__global__ void col_sum_tile(const In* x, int64_t outer, int64_t inner, Out* out) {
  __shared__ double part[kRowLanes][kColTile];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t s = blockIdx.y, splits = gridDim.y;
  const int64_t r_lo = outer * s / splits, r_hi = outer * (s + 1) / splits;
  for (int64_t c0 = blockIdx.x * int64_t(kColTile); c0 < inner;
       c0 += int64_t(gridDim.x) * kColTile) {
    const int64_t c = c0 + tx;
    double acc = 0.0;
    if (c < inner) {
#pragma unroll 4
      for (int64_t r = r_lo + ty; r < r_hi; r += kRowLanes)
        acc += static_cast<double>(load(x + r * inner + c));
    }
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && c < inner) {
      double total = 0.0;
      for (int y = 0; y < kRowLanes; ++y) total += part[y][tx];
      store_sum(out + s * inner + c, total);
    }
    __syncthreads();  // part is rewritten by the next tile
  }
}

// partial [splits, inner] -> out [inner]: each thread sums one column over the splits in order.
template <typename T>
__global__ void col_sum_partials(const double* partial, int64_t inner, int splits, T* out) {
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < inner;
       c += int64_t(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int s = 0; s < splits; ++s) acc += partial[s * inner + c];
    store_sum(out + c, acc);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// x [outer, inner] -> out [outer] (sums of squares when Square); the partials of a split row
// are plain sums.
template <bool Square = false, typename T>
void launch_sum_inner(int64_t outer, int64_t inner, const T* x, T* out) {
  if (outer == 0) return;
  cudaStream_t stream = compute_stream();
  if (inner <= kWarpRowMax) {  // also inner == 0: every row sums to 0
    row_sum_warp<Square><<<grid_for(outer, kWarpsPerBlock), kThreads, 0, stream>>>(x, outer,
                                                                                   inner, out);
    MOD_CUDA_CHECK_LAUNCH();
    return;
  }
  int64_t splits = 1;
  if (outer < kTargetBlocks)
    splits = std::min(ceil_div(kTargetBlocks, outer), ceil_div(inner, kMinSplitElements));
  if (splits == 1) {
    row_sum_block<Square><<<grid_for(outer, 1), kThreads, 0, stream>>>(x, outer, inner, 1, out);
    MOD_CUDA_CHECK_LAUNCH();
    return;
  }
  // outer * splits < kTargetBlocks + outer < 2 * kTargetBlocks: one block per task.
  Tensor partial = Tensor::empty({outer * splits}, DType::F64, Device::CUDA);
  double* pp = partial.data<double>();
  row_sum_block<Square><<<static_cast<unsigned>(outer * splits), kThreads, 0, stream>>>(
      x, outer, inner, static_cast<int>(splits), pp);
  MOD_CUDA_CHECK_LAUNCH();
  row_sum_warp<false><<<grid_for(outer, kWarpsPerBlock), kThreads, 0, stream>>>(pp, outer, splits,
                                                                                out);
  MOD_CUDA_CHECK_LAUNCH();
}

// x [outer, inner] -> out [inner]
template <typename T>
void launch_sum_outer(int64_t outer, int64_t inner, const T* x, T* out) {
  if (inner == 0) return;
  cudaStream_t stream = compute_stream();
  const int64_t tiles = ceil_div(inner, kColTile);
  int64_t splits = 1;
  if (tiles < kTargetBlocks)
    splits = std::max<int64_t>(
        1, std::min(ceil_div(kTargetBlocks, tiles), outer / kMinSplitRows));  // <= 1024
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>(std::min(tiles, kMaxGridX)),
                  static_cast<unsigned>(splits));
  if (splits == 1) {  // also outer == 0: every column sums to 0
    col_sum_tile<<<grid, block, 0, stream>>>(x, outer, inner, out);
    MOD_CUDA_CHECK_LAUNCH();
    return;
  }
  Tensor partial = Tensor::empty({splits * inner}, DType::F64, Device::CUDA);
  double* pp = partial.data<double>();
  col_sum_tile<<<grid, block, 0, stream>>>(x, outer, inner, pp);
  MOD_CUDA_CHECK_LAUNCH();
  col_sum_partials<<<grid_for(inner), kThreads, 0, stream>>>(pp, inner, static_cast<int>(splits),
                                                             out);
  MOD_CUDA_CHECK_LAUNCH();
}

}  // namespace

// x any shape -> out one element (0 for an empty x)
void CudaBackend::sum_all(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_all", [&](auto z) {
    using T = decltype(z);
    launch_sum_inner(1, x.numel(), x.data<T>(), out.data<T>());
  });
}

void CudaBackend::sum_squares(const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_squares", [&](auto z) {
    using T = decltype(z);
    launch_sum_inner<true>(1, x.numel(), x.data<T>(), out.data<T>());
  });
}

// x [outer, inner] -> out [inner]
void CudaBackend::sum_outer(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_outer", [&](auto z) {
    using T = decltype(z);
    launch_sum_outer(outer, inner, x.data<T>(), out.data<T>());
  });
}

// x [outer, inner] -> out [outer]
void CudaBackend::sum_inner(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) {
  dispatch_float(x.dtype(), "sum_inner", [&](auto z) {
    using T = decltype(z);
    launch_sum_inner(outer, inner, x.data<T>(), out.data<T>());
  });
}

}  // namespace mod::cuda
