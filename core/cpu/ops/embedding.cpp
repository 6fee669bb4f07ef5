// CPU embedding kernels: a row copy forward, a scatter-add backward. The backward is race-free
// without atomics: each thread owns a range of the D columns and walks every id, so repeated ids
// accumulate in id order (deterministic for any thread count).
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"

namespace mod::cpu {

namespace {
// ids [N], table [V,D] -> out [N,D]
template <typename T, typename I>
void embedding_forward_rows(const I* ids, const T* table, T* out, int64_t n, int64_t d) {
#pragma omp parallel for schedule(static) if (n * d > kParallelElements)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * d, table + static_cast<int64_t>(ids[i]) * d,
                static_cast<size_t>(d) * sizeof(T));
}

// dtable [V,D] += dout [N,D] scattered by ids [N]. Column tiles are whole 64-byte lines.
template <typename T, typename I>
void embedding_backward_columns(const I* ids, const T* dout, T* dtable, int64_t n, int64_t d) {
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t threads = omp_get_max_threads();
  const int64_t per_thread = (d + threads - 1) / threads;
  const int64_t tile = std::max(kLine, (per_thread + kLine - 1) / kLine * kLine);
  const int64_t tiles = (d + tile - 1) / tile;
#pragma omp parallel for schedule(static) if (n * d > kParallelElements && tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t lo = t * tile, hi = std::min(d, lo + tile);
    for (int64_t i = 0; i < n; ++i) {
      T* dst = dtable + static_cast<int64_t>(ids[i]) * d;
      const T* src = dout + i * d;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) dst[j] += src[j];
    }
  }
}
}  // namespace

void CpuBackend::embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) {
  dispatch_float(table.dtype(), "embedding_forward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(ids.dtype(), "embedding_forward", [&](auto zi) {
      using I = decltype(zi);
      embedding_forward_rows(ids.data<I>(), table.data<T>(), out.data<T>(), ids.numel(),
                             table.size(1));
    });
  });
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) {
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto z) {
    using T = decltype(z);
    dispatch_index(ids.dtype(), "embedding_backward", [&](auto zi) {
      using I = decltype(zi);
      embedding_backward_columns(ids.data<I>(), dout.data<T>(), dtable.data<T>(), ids.numel(),
                                 dtable.size(1));
    });
  });
}

void CpuBackend::index_slice(const Tensor& ids, int64_t start, int64_t rows, Tensor& local,
                             Tensor& here) {
  const int64_t n = ids.numel();
  int64_t* out = local.data<int64_t>();
  dispatch_float(here.dtype(), "index_slice", [&](auto z) {
    using T = decltype(z);
    T* flag = here.data<T>();
    auto scan = [&](const auto* p) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = static_cast<int64_t>(p[i]) - start;
        const bool mine = id >= 0 && id < rows;
        out[i] = mine ? id : 0;
        flag[i] = mine ? T(1) : T(0);
      }
    };
    if (ids.dtype() == DType::I32)
      scan(ids.data<int32_t>());
    else
      scan(ids.data<int64_t>());
  });
}

}  // namespace mod::cpu
