// Emulated devices with an H100 SXM's published figures (sm_90, 132 SMs, 227 KiB of opt-in
// shared memory per block: CUDA C++ Programming Guide, "Compute Capabilities"), so the backend's
// launch limits and FLOP peaks take their sm_90 paths. Nothing here is timed. One device, or
// MOD_EMU_DEVICES of them (a node's GPUs, 1 to 16): they differ only in their index and PCI bus
// id (device d on bus d + 1), which is what NCCL tells ranks' GPUs apart by; their memory is the
// process's one arena.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "emu/launch.h"
#include "state.h"

namespace emu::rt {
bool options_from_environment();
}

namespace {
constexpr int kSms = 132;
constexpr int kClockKhz = 1980000;
int current = 0;

int device_count() {
  static const int count = [] {
    const char* v = std::getenv("MOD_EMU_DEVICES");
    if (v == nullptr || *v == '\0') return 1;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 16) {
      std::fprintf(stderr, "emulator: MOD_EMU_DEVICES=%s: expected a whole number from 1 to 16\n", v);
      std::exit(2);
    }
    return static_cast<int>(n);
  }();
  return count;
}

cudaError_t check_device(int device) {
  return device >= 0 && device < device_count()
             ? cudaSuccess
             : emu::rt::detail::record_error(cudaErrorInvalidDevice);
}
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  (void)emu::rt::options_from_environment();
  if (count == nullptr) return emu::rt::detail::record_error(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (const cudaError_t e = check_device(device); e != cudaSuccess) return e;
  current = device;
  return emu::rt::detail::sticky_error();
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return emu::rt::detail::record_error(cudaErrorInvalidValue);
  *device = current;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (p == nullptr) return emu::rt::detail::record_error(cudaErrorInvalidValue);
  if (const cudaError_t e = check_device(device); e != cudaSuccess) return e;
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "modtrain SIMT emulator (sm_90)", sizeof p->name - 1);
  p->major = 9;
  p->minor = 0;
  p->totalGlobalMem = size_t{80} << 30;
  p->sharedMemPerBlock = emu::kDefaultDynamicSharedBytes;
  p->sharedMemPerBlockOptin = emu::kMaxDynamicSharedBytes;
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->multiProcessorCount = kSms;
  p->maxThreadsPerMultiProcessor = 2048;
  p->l2CacheSize = 50 << 20;
  p->unifiedAddressing = 1;
  p->concurrentKernels = 1;
  p->pciBusID = device + 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return emu::rt::detail::record_error(cudaErrorInvalidValue);
  if (const cudaError_t e = check_device(device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = kSms;
      break;
    case cudaDevAttrClockRate:
      *value = kClockKhz;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = emu::kMaxDynamicSharedBytes;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = emu::kDefaultDynamicSharedBytes;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    default:
      return emu::rt::detail::record_error(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

// cudaFuncAttributeMaxDynamicSharedMemorySize raises a kernel's limit (Programming Guide,
// "Shared Memory" for compute capability 9.0: above 48 KiB needs this opt-in).
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return emu::rt::detail::record_error(cudaErrorNotSupported);
  if (value < 0) return emu::rt::detail::record_error(cudaErrorInvalidValue);
  const emu::Status s = emu::set_max_dynamic_shared_bytes(func, static_cast<size_t>(value));
  return s.ok() ? cudaSuccess : emu::rt::detail::record_error(cudaErrorInvalidValue);
}

}  // extern "C"
