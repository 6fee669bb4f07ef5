// CPU backend: memory, copies and conversions (the kernels are in core/cpu/ops/<family>.cpp; the
// device registry, backend(Device), in core/backend_registry.cpp).
#include "core/cpu/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "core/cpu/blas.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/host_allocator.h"

namespace mod {

namespace cpu {

std::string CpuBackend::describe() const {
  return "CPU: " + std::to_string(omp_get_max_threads()) + " OpenMP threads; GEMM: " +
         blas_describe();
}

void* CpuBackend::allocate(size_t bytes) { return host_allocate(bytes); }

void CpuBackend::deallocate(void* ptr, size_t bytes) { host_deallocate(ptr, bytes); }

MemoryStats CpuBackend::memory_stats() const {
  return {host_in_use_bytes(), host_peak_in_use_bytes()};
}

void CpuBackend::reset_peak_memory() { host_reset_peak(); }

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
  OpTraceScope trace("copy");
  if (src.raw_data() != dst.raw_data()) std::memcpy(dst.raw_data(), src.raw_data(), src.nbytes());
}

void CpuBackend::copy_rows(const Tensor& src, size_t src_offset, size_t src_pitch, Tensor& dst,
                           size_t dst_offset, size_t dst_pitch, size_t rows, size_t width) {
  OpTraceScope trace("copy_rows");
  const char* in = static_cast<const char*>(src.raw_data()) + src_offset;
  char* out = static_cast<char*>(dst.raw_data()) + dst_offset;
  for (size_t i = 0; i < rows; ++i) std::memcpy(out + i * dst_pitch, in + i * src_pitch, width);
}

void CpuBackend::convert(const Tensor& src, Tensor& dst) {
  if (src.dtype() == DType::BF16 || dst.dtype() == DType::BF16) {  // checkpoints, tests: rare
    for (int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.at(i));
    return;
  }
  dispatch_float(src.dtype(), "convert", [&](auto s) {
    using S = decltype(s);
    dispatch_float(dst.dtype(), "convert", [&](auto d) {
      using D = decltype(d);
      const S* in = src.data<S>();
      D* out = dst.data<D>();
      const int64_t n = src.numel();
#pragma omp parallel for simd if (n > kParallelElements)
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<D>(in[i]);
    });
  });
}

void CpuBackend::fill(Tensor& dst, double value) {
  const int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::I32: std::fill_n(dst.data<int32_t>(), n, static_cast<int32_t>(value)); return;
    case DType::I64: std::fill_n(dst.data<int64_t>(), n, static_cast<int64_t>(value)); return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) dst.set(i, value);
      return;
    default:
      dispatch_float(dst.dtype(), "fill", [&](auto z) {
        using T = decltype(z);
        T* p = dst.data<T>();
        const T v = static_cast<T>(value);
#pragma omp parallel for simd if (n > kParallelElements)
        for (int64_t i = 0; i < n; ++i) p[i] = v;
      });
  }
}

}  // namespace cpu

}  // namespace mod
