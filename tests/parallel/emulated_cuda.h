// The GPU code path without a GPU: a backend that reports Device::CUDA but runs the CPU kernels
// on host memory. Installed, it serves every "cuda" tensor in the program, so training with
// train.device CUDA exercises the device path's plumbing, and any host access to a device
// tensor that was missed (Tensor::at, set) throws. Its kernels being the CPU's, results must
// equal a CPU run's bitwise.
#pragma once

#include <string>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"

namespace mod::test {

class EmulatedCudaBackend final : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::CUDA; }
  std::string describe() const override { return "emulated CUDA (CPU kernels)"; }
};

// Installed for the whole program: device tensors may outlive any one test case.
inline void emulate_cuda() {
  static EmulatedCudaBackend* backend = [] {
    auto* b = new EmulatedCudaBackend;
    set_cuda_backend_for_testing(b);
    return b;
  }();
  (void)backend;
}

}  // namespace mod::test
