// CUDA backend: memory, copies between host and device, dtype conversion and fill.
#include <cuda_runtime.h>

#include "core/cuda/allocator.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/device.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/pointwise.cuh"

namespace mod::cuda {

namespace {
// A value as it is: launch_pointwise stores it in the destination's dtype.
struct Identity {
  template <typename A>
  __device__ A operator()(A v) const {
    return v;
  }
};

template <typename T>
__global__ void fill_kernel(T* out, T value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = value;
}

template <typename T>
void launch_fill(Tensor& dst, T value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  fill_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(dst.data<T>(), value, n);
  MOD_CUDA_CHECK_LAUNCH();
}
}  // namespace

std::string CudaBackend::describe() const {
  cudaDeviceProp p{};
  MOD_CUDA_CHECK(cudaGetDeviceProperties(&p, current_device()));
  return "CUDA device " + std::to_string(current_device()) + ": " + p.name + " (sm_" +
         std::to_string(p.major) + std::to_string(p.minor) + "); GEMM: cuBLAS";
}

void* CudaBackend::allocate(size_t bytes) { return device_allocate(bytes); }

void CudaBackend::deallocate(void* ptr, size_t bytes) { device_deallocate(ptr, bytes); }

MemoryStats CudaBackend::memory_stats() const {
  const AllocatorStats s = allocator_stats();
  return {s.in_use_bytes, s.peak_in_use_bytes};
}

void CudaBackend::reset_peak_memory() { reset_peak_in_use(); }

// Either side may be host memory (Tensor::to(Device) and copy_from come here for every copy
// that touches the GPU). A copy to or from the host returns once the data is in place.
void CudaBackend::copy(const Tensor& src, Tensor& dst) {
  if (src.raw_data() == dst.raw_data() || src.nbytes() == 0) return;
  MOD_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), src.nbytes(), cudaMemcpyDefault,
                                 compute_stream()));
  if (src.device() == Device::CPU || dst.device() == Device::CPU) synchronize();
}

void CudaBackend::copy_rows(const Tensor& src, size_t src_offset, size_t src_pitch, Tensor& dst,
                            size_t dst_offset, size_t dst_pitch, size_t rows, size_t width) {
  if (rows == 0 || width == 0) return;
  MOD_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(dst.raw_data()) + dst_offset, dst_pitch,
                                   static_cast<const char*>(src.raw_data()) + src_offset,
                                   src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                   compute_stream()));
}

void CudaBackend::convert(const Tensor& src, Tensor& dst) {
  const int64_t n = src.numel();
  if (n == 0) return;
  dispatch_float(src.dtype(), "convert", [&](auto s) {
    using S = decltype(s);
    dispatch_float(dst.dtype(), "convert", [&](auto d) {
      using D = decltype(d);
      launch_pointwise(n, src.data<S>(), dst.data<D>(), Identity{});
    });
  });
}

void CudaBackend::fill(Tensor& dst, double value) {
  switch (dst.dtype()) {
    case DType::I32: return launch_fill(dst, static_cast<int32_t>(value));
    case DType::I64: return launch_fill(dst, static_cast<int64_t>(value));
    case DType::F32: return launch_fill(dst, static_cast<float>(value));
    case DType::F64: return launch_fill(dst, value);
    case DType::BF16: return launch_fill(dst, __float2bfloat16(static_cast<float>(value)));
  }
}

CudaBackend& cuda_backend() {
  if (device_count() == 0)
    throw std::runtime_error("tensor on cuda: no CUDA device is visible (" + describe_devices() +
                             ")");
  static CudaBackend* b = new CudaBackend;  // leaked: see stream.cu
  return *b;
}

}  // namespace mod::cuda
