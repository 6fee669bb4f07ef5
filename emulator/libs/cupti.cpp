// CUPTI's activity API over the emulator's runtime: libcupti.so.13, which core/cuda/device_trace.cu
// opens with dlopen as it opens NVIDIA's (tests put this one first on LD_LIBRARY_PATH). The
// calls the trace makes, with CUPTI's rules (CUPTI documentation, "Activity API"):
// cuptiActivityRegisterCallbacks hands CUPTI a function that supplies empty buffers and one that
// takes filled ones back; enabled kinds are recorded into the current buffer as the work runs;
// cuptiActivityFlushAll hands back the buffer in use; cuptiActivityGetNextRecord walks a buffer
// and returns CUPTI_ERROR_MAX_LIMIT_REACHED past its last record.
//
// A record is what the runtime observed (emu_observe_activity, emulator/include/emu/runtime.h):
// kernels under their launch names, which lack the template arguments a GPU's mangled names carry
// ("topk_rank_flags", not "topk_rank_flags<float>"); cuBLAS, cuBLASLt and NCCL calls as kernels
// named by the call ("cublasLtMatmul", "ncclAllReduce"), where a GPU shows the library's own
// kernels; copies with their direction and memsets. Times are host nanoseconds of the emulated
// run. Kinds other than kernels, copies and memsets are CUPTI_ERROR_NOT_SUPPORTED.
#include <cupti_activity.h>
#include <cupti_result.h>

#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "emu/runtime.h"

namespace {

std::mutex g_mutex;
CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
bool g_kernels = false, g_copies = false, g_memsets = false;
uint8_t* g_buffer = nullptr;
size_t g_size = 0, g_used = 0;
uint32_t g_correlation = 0;
std::set<std::string> g_names;  // records point at these for the life of the process

constexpr size_t round8(size_t n) {
  return (n + 7) & ~size_t{7};
}

size_t record_size(CUpti_ActivityKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_KIND_MEMCPY: return round8(sizeof(CUpti_ActivityMemcpy6));
    case CUPTI_ACTIVITY_KIND_MEMSET: return round8(sizeof(CUpti_ActivityMemset4));
    default: return round8(sizeof(CUpti_ActivityKernel10));
  }
}

void hand_back_locked() {
  if (g_buffer == nullptr) return;
  uint8_t* buffer = std::exchange(g_buffer, nullptr);
  g_complete(nullptr, 0, buffer, g_size, std::exchange(g_used, 0));
}

template <typename Record>
void append_locked(const Record& r) {
  if (g_request == nullptr || g_complete == nullptr) return;
  if (g_buffer != nullptr && g_used + round8(sizeof(Record)) > g_size) hand_back_locked();
  if (g_buffer == nullptr) {
    size_t max_records = 0;
    g_request(&g_buffer, &g_size, &max_records);
    g_used = 0;
    if (g_buffer == nullptr || g_size < round8(sizeof(Record))) {  // CUPTI drops the record
      g_buffer = nullptr;
      return;
    }
  }
  std::memcpy(g_buffer + g_used, &r, sizeof(Record));
  g_used += round8(sizeof(Record));
}

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

uint8_t copy_kind(const char* what) {
  const char* dir = std::strrchr(what, ' ');
  if (dir == nullptr) return CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN;
  if (std::strcmp(dir, " HtoD") == 0) return CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
  if (std::strcmp(dir, " DtoH") == 0) return CUPTI_ACTIVITY_MEMCPY_KIND_DTOH;
  if (std::strcmp(dir, " DtoD") == 0) return CUPTI_ACTIVITY_MEMCPY_KIND_DTOD;
  if (std::strcmp(dir, " HtoH") == 0) return CUPTI_ACTIVITY_MEMCPY_KIND_HTOH;
  return CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN;
}

void observe(const char* what, uint64_t start, uint64_t end) {
  std::lock_guard lock(g_mutex);
  if (starts_with(what, "cudaMemcpy")) {
    if (!g_copies) return;
    CUpti_ActivityMemcpy6 r{};
    r.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    r.copyKind = copy_kind(what);
    r.start = start;
    r.end = end;
    r.correlationId = ++g_correlation;
    append_locked(r);
  } else if (starts_with(what, "cudaMemset")) {
    if (!g_memsets) return;
    CUpti_ActivityMemset4 r{};
    r.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    r.start = start;
    r.end = end;
    r.correlationId = ++g_correlation;
    append_locked(r);
  } else if (!starts_with(what, "cuda")) {  // not a graph launch (its nodes come one by one)
    if (!g_kernels) return;
    CUpti_ActivityKernel10 r{};
    r.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    r.name = g_names.insert(what).first->c_str();
    r.start = start;
    r.end = end;
    r.correlationId = ++g_correlation;
    append_locked(r);
  }
}

CUptiResult set_kind(CUpti_ActivityKind kind, bool on) {
  bool any = false;
  {
    std::lock_guard lock(g_mutex);
    switch (kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: g_kernels = on; break;
      case CUPTI_ACTIVITY_KIND_MEMCPY: g_copies = on; break;
      case CUPTI_ACTIVITY_KIND_MEMSET: g_memsets = on; break;
      default: return CUPTI_ERROR_NOT_SUPPORTED;
    }
    any = g_kernels || g_copies || g_memsets;
  }
  emu_observe_activity(any ? observe : nullptr);
  return CUPTI_SUCCESS;
}

}  // namespace

extern "C" {

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
  return set_kind(kind, true);
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind) {
  return set_kind(kind, false);
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                                    CUpti_BuffersCallbackCompleteFunc complete) {
  if (request == nullptr || complete == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  std::lock_guard lock(g_mutex);
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t /*flag*/) {
  std::lock_guard lock(g_mutex);
  hand_back_locked();
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid,
                                                CUpti_Activity** record) {
  if (buffer == nullptr || record == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  uint8_t* next = *record == nullptr
                      ? buffer
                      : reinterpret_cast<uint8_t*>(*record) + record_size((*record)->kind);
  if (next >= buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(next);
  return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char** str) {
  if (str == nullptr) return CUPTI_ERROR_INVALID_PARAMETER;
  switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return CUPTI_ERROR_INVALID_PARAMETER;
  }
  return CUPTI_SUCCESS;
}

}  // extern "C"
