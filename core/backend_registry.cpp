// The device registry: the one place that maps a device to the backend running its kernels, and
// what a backend without graphs says when asked to capture. Joins core/cpu and core/cuda, which
// never include each other.
#include <stdexcept>
#include <string>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"
#ifdef MOD_HAVE_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace mod {

namespace {
Backend* cuda_for_testing = nullptr;
}  // namespace

void Backend::begin_capture() {
  throw std::runtime_error("capture: the " + std::string(device_name(device())) +
                           " backend has no graphs to capture work into (CUDA only)");
}

std::unique_ptr<CapturedWork> Backend::end_capture() {
  throw std::runtime_error("capture: the " + std::string(device_name(device())) +
                           " backend has no graphs to capture work into (CUDA only)");
}

void Backend::run_if_any(const Tensor& flags, const std::function<void()>& body) {
  (void)flags;
  body();
}

void set_cuda_backend_for_testing(Backend* b) {
  cuda_for_testing = b;
}

Backend& backend(Device device) {
  // Leaked on purpose: tensors in static storage may be freed after static destructors ran.
  static cpu::CpuBackend* cpu_backend = new cpu::CpuBackend;
  if (device == Device::CPU) return *cpu_backend;
  if (cuda_for_testing != nullptr) return *cuda_for_testing;
#ifdef MOD_HAVE_CUDA
  return cuda::cuda_backend();
#else
  throw std::runtime_error(
      "tensor on cuda: this build has no CUDA (configure with nvcc on PATH, MOD_USE_CUDA=ON)");
#endif
}

}  // namespace mod
