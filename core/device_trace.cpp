// Builds without CUDA have no device to trace (core/cuda/device_trace.cu is the real one).
#include "core/device_trace.h"

#ifndef MOD_HAVE_CUDA
#include <stdexcept>

namespace mod {

void start_device_trace() {
  throw std::runtime_error("device trace: this modtrain was built without CUDA (MOD_USE_CUDA=ON)");
}
std::vector<DeviceActivity> stop_device_trace() { return {}; }

}  // namespace mod
#endif
