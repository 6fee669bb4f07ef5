// What the GPU ran over a window of work, as CUPTI's activity records (train.profile_steps):
// every kernel, copy and fill, with device timestamps. CUPTI is opened with dlopen when a trace
// starts, so nothing links it and a run that never traces never loads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mod {

struct DeviceActivity {
  // A kernel's mangled name as CUPTI gives it, "[memcpy HtoD]", "[memset]", or a CPU op's name
  // ("gelu_forward", "gemm NT 2048x768x256").
  std::string name;
  uint64_t start_ns = 0, end_ns = 0;
  double flop = 0;  // work done, where the recorder knows it (the CPU's GEMMs); else 0
};

// Start recording this process's device activity. Throws std::runtime_error naming what is
// missing: a build without CUDA, or no libcupti to open.
void start_device_trace();
// Wait for the device, stop recording and return what ran since start_device_trace().
std::vector<DeviceActivity> stop_device_trace();

}  // namespace mod
