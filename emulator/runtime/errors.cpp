// CUDA's two kinds of error (CUDA Runtime API, "Error Handling"): the last error, which
// cudaGetLastError returns and resets, and a sticky error, a fault in device work, after which
// every call fails until the process ends. The emulator's sticky errors carry a message that
// names the kernel or library call, printed to stderr once.
#include <cstdio>
#include <string>

#include "emu/kernel_launch.h"
#include "emu/runtime.h"
#include "state.h"

namespace emu::rt::detail {
namespace {
thread_local cudaError_t last_error = cudaSuccess;
cudaError_t sticky = cudaSuccess;
std::string sticky_message;
}  // namespace

std::recursive_mutex& mutex() {
  static std::recursive_mutex m;
  return m;
}

cudaError_t sticky_error() {
  return sticky;
}

cudaError_t record_error(cudaError_t code) {
  if (code != cudaSuccess) last_error = code;
  return code;
}

}  // namespace emu::rt::detail

namespace emu::rt {

void fail_sticky(cudaError_t code, const std::string& message) {
  std::lock_guard lock(detail::mutex());
  if (detail::sticky != cudaSuccess) return;
  detail::sticky = code;
  detail::sticky_message = message;
  detail::last_error = code;
  std::fprintf(stderr, "emulator: %s (%s, sticky: every later CUDA call fails)\n", message.c_str(),
               cudaGetErrorName(code));
}

const std::string& sticky_message() {
  return detail::sticky_message;
}

void reset_for_tests() {
  std::lock_guard lock(detail::mutex());
  detail::sticky = cudaSuccess;
  detail::sticky_message.clear();
  detail::last_error = cudaSuccess;
}

}  // namespace emu::rt

extern "C" {

cudaError_t cudaGetLastError() {
  const cudaError_t e = emu::rt::detail::last_error;
  emu::rt::detail::last_error = emu::rt::detail::sticky;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  return emu::rt::detail::last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define MOD_EMU_ERROR(name) \
  case name:                \
    return #name;
    MOD_EMU_ERROR(cudaSuccess)
    MOD_EMU_ERROR(cudaErrorInvalidValue)
    MOD_EMU_ERROR(cudaErrorMemoryAllocation)
    MOD_EMU_ERROR(cudaErrorInitializationError)
    MOD_EMU_ERROR(cudaErrorInvalidConfiguration)
    MOD_EMU_ERROR(cudaErrorInvalidDevice)
    MOD_EMU_ERROR(cudaErrorInvalidDevicePointer)
    MOD_EMU_ERROR(cudaErrorInvalidMemcpyDirection)
    MOD_EMU_ERROR(cudaErrorInvalidResourceHandle)
    MOD_EMU_ERROR(cudaErrorNotReady)
    MOD_EMU_ERROR(cudaErrorIllegalAddress)
    MOD_EMU_ERROR(cudaErrorLaunchFailure)
    MOD_EMU_ERROR(cudaErrorNotSupported)
    MOD_EMU_ERROR(cudaErrorIllegalState)
    MOD_EMU_ERROR(cudaErrorStreamCaptureUnsupported)
    MOD_EMU_ERROR(cudaErrorStreamCaptureInvalidated)
    MOD_EMU_ERROR(cudaErrorStreamCaptureMerge)
    MOD_EMU_ERROR(cudaErrorStreamCaptureUnmatched)
    MOD_EMU_ERROR(cudaErrorStreamCaptureUnjoined)
    MOD_EMU_ERROR(cudaErrorStreamCaptureIsolation)
    MOD_EMU_ERROR(cudaErrorStreamCaptureImplicit)
    MOD_EMU_ERROR(cudaErrorCapturedEvent)
    MOD_EMU_ERROR(cudaErrorStreamCaptureWrongThread)
    MOD_EMU_ERROR(cudaErrorGraphExecUpdateFailure)
#undef MOD_EMU_ERROR
    default:
      return "cudaErrorUnknown";
  }
}

// The toolkit's own wording for the codes the backend's messages show.
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    default:
      return cudaGetErrorName(error);
  }
}

}  // extern "C"

namespace emu::rt {

void launch_refused(const Status& status) {
  std::fprintf(stderr, "emulator: %s\n", status.message.c_str());
  detail::record_error(static_cast<cudaError_t>(status.code));
}

void launch_failed(const Status& status) {
  const cudaError_t code = status.code == ErrorCode::kSynccheck
                               ? cudaErrorLaunchFailure
                               : static_cast<cudaError_t>(status.code);
  fail_sticky(code, status.message);
}

}  // namespace emu::rt
