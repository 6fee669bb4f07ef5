// CUDA embedding kernels: a row gather forward, a scatter-add backward (core/cpu/ops/embedding.cpp).
// Work split: one grid-stride loop over the flat [N, D] index, so a warp reads or writes 32
// adjacent columns of one row (coalesced) and any N, D fit the grid; (row, col) advance
// incrementally instead of dividing a 64-bit index per element. The id of a row is a broadcast
// load that stays in L1.
// The backward accumulates with atomicAdd in the storage type, because repeated ids (the same
// token twice in a batch) hit the same row: unlike the CPU's column-owned loop, the order of
// the adds for a repeated id varies from run to run (f32 sums may differ in the last bits).
#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

// ids [N], table [V, D] -> out [N, D]; total = N * D > 0
template <typename T, typename I>
__global__ void embedding_gather(const I* ids, const T* table, T* out, int64_t total, int64_t d) {
  for (GridRowCol at(d); at.i < total; at.next())
    out[at.i] = table[static_cast<int64_t>(ids[at.row]) * d + at.col];
}

// dtable [V, D] += dout [N, D] scattered by ids [N]; total = N * D > 0.
// bf16 uses the sm_80+ atomicAdd on __nv_bfloat16: each add rounds the running sum to bf16
// (8 significant bits), so an id repeated k times carries about k roundings of 2^-9 relative
// error, and the result depends on the order the adds land in.
template <typename T, typename I>
__global__ void embedding_scatter_add(const I* ids, const T* dout, T* dtable, int64_t total,
                                      int64_t d) {
  for (GridRowCol at(d); at.i < total; at.next())
    atomicAdd(dtable + static_cast<int64_t>(ids[at.row]) * d + at.col, dout[at.i]);
}

}  // namespace

// ids [N] (i32/i64), table [V, D], out [N, D]
void CudaBackend::embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  const int64_t d = table.size(1), total = ids.numel() * d;
  if (total == 0) return;
  dispatch_float(table.dtype(), "embedding_forward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(ids.dtype(), "embedding_forward", [&](auto zi) {
      using I = decltype(zi);
      embedding_gather<<<grid_for(total), kThreads, 0, compute_stream()>>>(
          ids.data<I>(), table.data<T>(), out.data<T>(), total, d);
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

// ids [N] (i32/i64), dout [N, D], dtable [V, D] (accumulated into)
void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  const int64_t d = dtable.size(1), total = ids.numel() * d;
  if (total == 0) return;
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(ids.dtype(), "embedding_backward", [&](auto zi) {
      using I = decltype(zi);
      embedding_scatter_add<<<grid_for(total), kThreads, 0, compute_stream()>>>(
          ids.data<I>(), dout.data<T>(), dtable.data<T>(), total, d);
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

namespace {
template <typename I, typename T>
__global__ void index_slice_kernel(const I* ids, int64_t n, int64_t start, int64_t rows,
                                   int64_t* local, T* here) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = static_cast<int64_t>(ids[i]) - start;
    const bool mine = id >= 0 && id < rows;
    local[i] = mine ? id : 0;
    here[i] = from_acc<T>(mine ? Acc<T>(1) : Acc<T>(0));
  }
}
}  // namespace

void CudaBackend::index_slice(const Tensor& ids, int64_t start, int64_t rows, Tensor& local,
                              Tensor& here) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  dispatch_float(here.dtype(), "index_slice", [&](auto z) {
    using T = decltype(z);
    dispatch_index(ids.dtype(), "index_slice", [&](auto zi) {
      using I = decltype(zi);
      index_slice_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
          ids.data<I>(), n, start, rows, local.data<int64_t>(), here.data<T>());
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mod::cuda
