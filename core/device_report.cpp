// Start-up report of compute devices (see device_report.h).
#include "core/device_report.h"

#include "core/backend.h"
#ifdef MOD_HAVE_CUDA
#include "core/cuda/device.h"
#endif

namespace mod {

int cuda_device_count() {
#ifdef MOD_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

std::string device_report() {
  std::string out = backend(Device::CPU).describe();
#ifdef MOD_HAVE_CUDA
  out += '\n';
  out += cuda::describe_devices();
#else
  out += "\nCUDA: not in this build (configure with -DMOD_USE_CUDA=ON)";
#endif
  return out;
}

}  // namespace mod
