// The built-in variables' storage, the process-wide default Options and error names.
// threadIdx is rewritten by the scheduler at every switch; the others once per block or launch.
#include "emu/builtins.h"

#include "emu/options.h"

thread_local constinit uint3 threadIdx{};
thread_local constinit uint3 blockIdx{};
thread_local constinit dim3 blockDim{};
thread_local constinit dim3 gridDim{};

namespace emu {

Options& default_options() {
  static Options options;
  return options;
}

const char* error_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kSuccess:
      return "cudaSuccess";
    case ErrorCode::kInvalidValue:
      return "cudaErrorInvalidValue";
    case ErrorCode::kInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case ErrorCode::kLaunchFailure:
      return "cudaErrorLaunchFailure";
    case ErrorCode::kSynccheck:
      return "emulator synccheck error";
  }
  return "unknown error";
}

}  // namespace emu
