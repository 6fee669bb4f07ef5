// Shared pieces of the CUDA kernels: dtype dispatch, the accumulation type and its math, launch
// sizes (flat and per row) and warp/block reductions. Kernels are templates over the storage
// type T (float, double, __nv_bfloat16) and, where they take indices, the index type I (int32_t,
// int64_t). Arithmetic runs in Acc<T> (float for f32 and bf16, double for f64); bf16 is only a
// storage format.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "core/dtype_dispatch.h"
#include "core/tensor.h"

namespace mod::cuda {

using bf16 = __nv_bfloat16;

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };
template <typename T> using Acc = typename AccOf<T>::type;

template <typename T> __device__ __forceinline__ Acc<T> load(const T* p) { return *p; }
template <> __device__ __forceinline__ float load<bf16>(const bf16* p) {
  return __bfloat162float(*p);
}
template <typename T> __device__ __forceinline__ Acc<T> to_acc(T v) { return v; }
template <> __device__ __forceinline__ float to_acc<bf16>(bf16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_acc(Acc<T> v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ bf16 from_acc<bf16>(float v) { return __float2bfloat16(v); }

// Acc math: the accurate functions (exp within 2 ulp; sqrtf IEEE-rounded under -prec-sqrt),
// never the __expf-style intrinsics, so results stay close to the CPU's.
// clang-format off
#define MOD_ACC_MATH(name, f32, f64)                                   \
  __device__ __forceinline__ float name(float v) { return f32(v); } \
  __device__ __forceinline__ double name(double v) { return f64(v); }
MOD_ACC_MATH(acc_exp, expf, exp)
MOD_ACC_MATH(acc_log, logf, log)
MOD_ACC_MATH(acc_log1p, log1pf, log1p)
MOD_ACC_MATH(acc_sqrt, sqrtf, sqrt)
MOD_ACC_MATH(acc_abs, fabsf, fabs)
#undef MOD_ACC_MATH
// clang-format on

// 1 / (1 + exp(-x)); saturates cleanly to 0 and 1.
template <typename A>
__device__ __forceinline__ A acc_sigmoid(A x) {
  return A(1) / (A(1) + acc_exp(-x));
}

// The dtype of an Acc<T> buffer (partial sums, delta) allocated on the host.
template <typename T>
constexpr DType acc_dtype() {
  return std::is_same_v<Acc<T>, double> ? DType::F64 : DType::F32;
}

using BF16Case = DTypeCase<DType::BF16, bf16>;

// Calls f(T{}) for the tensor's float dtype (f32, f64 or bf16); dispatch_index comes from
// core/dtype_dispatch.h.
template <typename F>
void dispatch_float(DType t, const char* kernel, F&& f) {
  dispatch_dtype<F32Case, F64Case, BF16Case>(t, kernel, "CUDA kernel takes", f);
}

// Calls f(S{}) with S the element type of the per-row statistics (rstd, mean, lse) an op keeps
// for T inputs: T itself, or float when T is bf16 (stats_dtype in core/ops/check.h).
template <typename T, typename F>
void dispatch_stats(DType stats, const char* kernel, F&& f) {
  constexpr DType own = std::is_same_v<T, bf16>     ? DType::BF16
                        : std::is_same_v<T, double> ? DType::F64
                                                    : DType::F32;
  if (stats == own) return f(T{});
  if constexpr (std::is_same_v<T, bf16>)
    if (stats == DType::F32) return f(float{});
  throw std::invalid_argument(std::string(kernel) + ": row statistics must be " + dtype_name(own) +
                              (std::is_same_v<T, bf16> ? " or f32" : "") + ", got " +
                              dtype_name(stats));
}

inline constexpr int kThreads = 256;
// Blocks for a grid-stride loop over n elements: enough to fill the device, never more than n
// needs.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// Row kernels (norm, softmax) run one block per row, grid-striding over rows past this cap.
inline constexpr int64_t kMaxRowBlocks = int64_t{1} << 20;
// Threads for one row of `cols` columns: about 8 columns each, a warp multiple in
// [32, max_threads].
inline int row_threads(int64_t cols, int max_threads) {
  const int64_t t = ((cols + 7) / 8 + 31) / 32 * 32;
  return static_cast<int>(std::clamp<int64_t>(t, 32, max_threads));
}
inline unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
}

// A grid-stride walk over the flat index i of a row-major [rows, cols] array that keeps
// (row, col) = (i / cols, i % cols) by additions: a 64-bit division per element would cost more
// than the memory traffic.
class GridRowCol {
 public:
  __device__ explicit GridRowCol(int64_t cols)
      : i(blockIdx.x * int64_t(blockDim.x) + threadIdx.x),
        row(i / cols),
        col(i % cols),
        cols_(cols),
        stride_(int64_t(gridDim.x) * blockDim.x),
        stride_row_(stride_ / cols),
        stride_col_(stride_ % cols) {}
  __device__ void next() {
    i += stride_;
    row += stride_row_;
    col += stride_col_;
    if (col >= cols_) {
      col -= cols_;
      ++row;
    }
  }

  int64_t i, row, col;

 private:
  int64_t cols_, stride_, stride_row_, stride_col_;
};

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values in shared memory; the block must be converged.
template <typename A>
__device__ A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : A(0);
  return warp_sum(v);
}

}  // namespace mod::cuda
