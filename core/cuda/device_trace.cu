// CUPTI's activity API behind core/device_trace.h. libcupti is opened with dlopen (the soname of
// this CUDA major, then the unversioned name), so nothing links it. CUPTI hands filled buffers
// to complete_buffer, possibly on its own thread; the records are copied out under a mutex.
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/device_trace.h"

namespace mod {

namespace {

struct Cupti {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

const Cupti& cupti() {
  static const Cupti api = [] {
    const std::string versioned = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
    void* lib = dlopen(versioned.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw std::runtime_error("device trace: cannot open " + versioned +
                               " (CUPTI, in the CUDA toolkit's lib64 or extras/CUPTI/lib64): "
                               "add its folder to LD_LIBRARY_PATH");
    Cupti c;
    auto load = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn) throw std::runtime_error(std::string("device trace: libcupti lacks ") + name);
    };
    load(c.enable, "cuptiActivityEnable");
    load(c.disable, "cuptiActivityDisable");
    load(c.register_callbacks, "cuptiActivityRegisterCallbacks");
    load(c.flush_all, "cuptiActivityFlushAll");
    load(c.next_record, "cuptiActivityGetNextRecord");
    load(c.result_string, "cuptiGetResultString");
    return c;
  }();
  return api;
}

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* text = "unknown error";
  cupti().result_string(r, &text);
  throw std::runtime_error(std::string("device trace: ") + what + " failed: " + text);
}

constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

std::mutex records_mutex;
std::vector<DeviceActivity> records;

const char* copy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    default: return "[memcpy]";
  }
}

void CUPTIAPI request_buffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI complete_buffer(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<DeviceActivity> got;
  CUpti_Activity* record = nullptr;
  while (cupti().next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      got.push_back({k->name ? k->name : "?", k->start, k->end});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      got.push_back({copy_kind(m->copyKind), m->start, m->end});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      got.push_back({"[memset]", m->start, m->end});
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(records_mutex);
  records.insert(records.end(), got.begin(), got.end());
}

}  // namespace

void start_device_trace() {
  const Cupti& c = cupti();
  MOD_CUDA_CHECK(cudaDeviceSynchronize());  // earlier work stays out of the window
  {
    std::lock_guard<std::mutex> lock(records_mutex);
    records.clear();
  }
  static const bool registered = [&c] {
    check(c.register_callbacks(request_buffer, complete_buffer), "cuptiActivityRegisterCallbacks");
    return true;
  }();
  (void)registered;
  for (CUpti_ActivityKind kind : kKinds) check(c.enable(kind), "cuptiActivityEnable");
}

std::vector<DeviceActivity> stop_device_trace() {
  const Cupti& c = cupti();
  MOD_CUDA_CHECK(cudaDeviceSynchronize());
  for (CUpti_ActivityKind kind : kKinds) check(c.disable(kind), "cuptiActivityDisable");
  check(c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard<std::mutex> lock(records_mutex);
  return std::exchange(records, {});
}

}  // namespace mod
