// CUDA device discovery: how many GPUs this process sees and what they are. Used for the
// start-up report and by GPU tests to skip, saying so, on machines without a GPU.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda/device.h"

namespace mod::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" / "no driver" error
    return 0;
  }
  return n;
}

std::string describe_devices() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("CUDA: no usable device (") + cudaGetErrorString(err) + ")";
  }
  std::string out = "CUDA: " + std::to_string(n) + " device(s)";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += "; " + std::to_string(i) + ": " + p.name + " sm_" + std::to_string(p.major) +
           std::to_string(p.minor) + " " +
           std::to_string(p.totalGlobalMem / (1024 * 1024 * 1024)) + " GiB";
  }
  return out;
}

}  // namespace mod::cuda
