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

double peak_flops(bool bf16) {
  int device = 0, sms = 0, khz = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  double per_clock = bf16 ? 1024 : 256;  // FLOPs per SM per clock
  if (major == 9) per_clock = bf16 ? 4096 : 256;
  if (major == 8 && minor == 0) per_clock = bf16 ? 2048 : 128;
  return per_clock * sms * khz * 1e3;
}

}  // namespace mod::cuda
