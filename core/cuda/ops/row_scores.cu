// One score per row against a wider weight (Backend::row_scores_*): MoD's router on bf16 rows
// with an f32 weight, reading each row once in its own dtype instead of a cast pass, an f32 copy
// and a GEMV over it (3 passes of 2 bytes and one of 4 per element, against one of 2).
//   forward   one warp per row, 16-byte loads of bf16 rows where aligned, a warp sum in f32;
//   dx        dr[n] w[d] in f32, rounded to x's dtype (what cast's backward rounds), or added
//             into x's gradient so far (what the engine's sum would add);
//   dw        a column sum over rows in two deterministic stages: blocks of kRowsPerChunk rows
//             write per-chunk partials, one pass adds them in chunk order.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

constexpr int kRowsPerChunk = 128;

template <bool kVec, typename TX, typename TW>
__global__ void row_scores_forward_kernel(const TX* x, const TW* w, TW* r, int64_t n, int64_t d) {
  using A = Acc<TW>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x >> 5) + (threadIdx.x >> 5); row < n;
       row += warps) {
    const TX* xr = x + row * d;
    A acc = 0;
    if constexpr (kVec) {  // TX is bf16, d a multiple of 8, rows 16-byte aligned
      const uint4* packs = reinterpret_cast<const uint4*>(xr);
      for (int64_t c = lane; c < d / 8; c += 32) {
        const uint4 p = packs[c];
        const bf16* v = reinterpret_cast<const bf16*>(&p);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += A(to_acc(v[j])) * A(load(w + c * 8 + j));
      }
    } else {
      for (int64_t c = lane; c < d; c += 32) acc += A(to_acc(xr[c])) * A(load(w + c));
    }
    acc = warp_sum(acc);
    if (lane == 0) r[row] = from_acc<TW>(acc);
  }
}

// dx = round(dr w), or dx + round(dr w) rounded again (what the engine's sum of the two
// gradients computes).
template <typename TX, typename TW>
__global__ void row_scores_dx_kernel(const TW* dr, const TW* w, TX* dx, int64_t n, int64_t d,
                                     bool accumulate) {
  using A = Acc<TW>;
  for (GridRowCol it(d); it.i < n * d; it.next()) {
    const TX v = from_acc<TX>(static_cast<Acc<TX>>(A(load(dr + it.row)) * A(load(w + it.col))));
    dx[it.i] = accumulate ? from_acc<TX>(to_acc(dx[it.i]) + to_acc(v)) : v;
  }
}

// partial[chunk, col] = sum over the chunk's rows of dr[row] x[row, col].
template <typename TX, typename TW>
__global__ void row_scores_dw_partial_kernel(const TX* x, const TW* dr, Acc<TW>* partial,
                                             int64_t n, int64_t d) {
  using A = Acc<TW>;
  const int64_t first = int64_t(blockIdx.x) * kRowsPerChunk;
  const int64_t last = first + kRowsPerChunk < n ? first + kRowsPerChunk : n;
  for (int64_t col = threadIdx.x; col < d; col += blockDim.x) {
    A acc = 0;
    for (int64_t row = first; row < last; ++row)
      acc += A(load(dr + row)) * A(to_acc(x[row * d + col]));
    partial[int64_t(blockIdx.x) * d + col] = acc;
  }
}

template <typename TW>
__global__ void row_scores_dw_sum_kernel(const Acc<TW>* partial, int64_t chunks, int64_t d,
                                         bool accumulate, TW* dw) {
  using A = Acc<TW>;
  for (int64_t col = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; col < d;
       col += int64_t(gridDim.x) * blockDim.x) {
    A acc = 0;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c * d + col];
    if (accumulate) acc += load(dw + col);
    dw[col] = from_acc<TW>(acc);
  }
}

// f(TX{}, TW{}) for x's and w's dtypes, x no wider than w.
template <typename F>
void dispatch_pair(const Tensor& x, const Tensor& w, const char* kernel, F&& f) {
  dispatch_float(w.dtype(), kernel, [&](auto tw) {
    dispatch_float(x.dtype(), kernel, [&](auto tx) {
      if constexpr (sizeof(tx) <= sizeof(tw)) {
        f(tx, tw);
      } else {
        throw std::invalid_argument(std::string(kernel) + ": x " + dtype_name(x.dtype()) +
                                    " is wider than w " + dtype_name(w.dtype()));
      }
    });
  });
}

}  // namespace

void CudaBackend::row_scores_forward(const Tensor& x, const Tensor& w, Tensor& r) {
  const int64_t n = x.size(0), d = x.size(1);
  if (n == 0) return;
  dispatch_pair(x, w, "row_scores_forward", [&](auto tx, auto tw) {
    using TX = decltype(tx);
    using TW = decltype(tw);
    constexpr int kWarps = kThreads / 32;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n + kWarps - 1) / kWarps,
                                                                    65535 * 8));
    const bool vec = std::is_same_v<TX, bf16> && d % 8 == 0 &&
                     reinterpret_cast<uintptr_t>(x.raw_data()) % 16 == 0;
    if (vec)
      row_scores_forward_kernel<std::is_same_v<TX, bf16>><<<blocks, kThreads, 0, compute_stream()>>>(
          x.data<TX>(), w.data<TW>(), r.data<TW>(), n, d);
    else
      row_scores_forward_kernel<false><<<blocks, kThreads, 0, compute_stream()>>>(
          x.data<TX>(), w.data<TW>(), r.data<TW>(), n, d);
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::row_scores_backward(const Tensor& x, const Tensor& w, const Tensor& dr,
                                      Tensor& dx, bool accumulate_dx, Tensor& dw,
                                      bool accumulate_dw) {
  const int64_t n = x.size(0), d = x.size(1);
  dispatch_pair(x, w, "row_scores_backward", [&](auto tx, auto tw) {
    using TX = decltype(tx);
    using TW = decltype(tw);
    if (dx.defined() && n * d > 0) {
      row_scores_dx_kernel<<<grid_for(n * d), kThreads, 0, compute_stream()>>>(
          dr.data<TW>(), w.data<TW>(), dx.data<TX>(), n, d, accumulate_dx);
      MOD_CUDA_CHECK_LAUNCH();
    }
    if (!dw.defined() || d == 0) return;
    const int64_t chunks = std::max<int64_t>(1, (n + kRowsPerChunk - 1) / kRowsPerChunk);
    Tensor partial = Tensor::empty({chunks, d}, acc_dtype<TW>(), Device::CUDA);
    if (n == 0)
      fill(partial, 0.0);
    else
      row_scores_dw_partial_kernel<<<static_cast<unsigned>(chunks), kThreads, 0,
                                     compute_stream()>>>(x.data<TX>(), dr.data<TW>(),
                                                         partial.data<Acc<TW>>(), n, d);
    MOD_CUDA_CHECK_LAUNCH();
    row_scores_dw_sum_kernel<TW><<<grid_for(d), kThreads, 0, compute_stream()>>>(
        partial.data<Acc<TW>>(), chunks, d, accumulate_dw, dw.data<TW>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mod::cuda
