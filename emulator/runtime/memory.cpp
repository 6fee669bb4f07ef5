// Device memory: every cudaMalloc is its own mapping, the allocation's end (rounded to 256
// bytes, cudaMalloc's alignment) against a guard page and another guard page below it, so a
// kernel that runs off either end faults at once instead of reading a neighbour. New memory is
// filled with 0xFF (a NaN as f32, bf16 or f64; -1 as an integer): cudaMalloc does not clear
// memory, and a kernel reading what nothing wrote gives NaN rather than a plausible zero. The
// device's size is MOD_EMU_DEVICE_MEMORY bytes (default 16 GiB), so out-of-memory paths run.
// Outside device work (a kernel, a copy, a library call running) every allocation is PROT_NONE,
// so the host reading or writing a device pointer faults as on a GPU without unified memory.
// Device work opens an allocation at its first touch (the fault handler makes it accessible)
// and closes what it opened when it ends: a launch pays for the allocations it uses, not for
// all of them. MOD_EMU_PROTECT=0 leaves device memory accessible.
//
// Copies and memsets follow the API's synchronization rules (CUDA Runtime API, "API
// synchronization behavior"): a copy involving pageable host memory synchronises with the host,
// which is why it is prohibited while its stream is captured (Programming Guide, "CUDA Graphs",
// "Prohibited and Unhandled Operations").
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "emu/runtime.h"
#include "state.h"

namespace emu::rt::detail {
namespace {

struct Allocation {
  size_t bytes = 0;
  void* mapping = nullptr;
  size_t mapping_bytes = 0;
  char* pages = nullptr;  // the accessible part, between the guard pages
  size_t pages_bytes = 0;
};

struct Memory {
  std::map<uintptr_t, Allocation> device;  // by start address
  std::map<uintptr_t, size_t> pinned;      // cudaMallocHost blocks
  size_t in_use = 0;
  size_t capacity = 0;
  int device_depth = 0;  // device work running (nested: a graph's nodes)
  bool protect = true;
  std::vector<const Allocation*> opened;  // by the running device work; capacity kept spare
};

Memory& memory() {
  static Memory* m = [] {
    auto* mem = new Memory;
    const char* v = std::getenv("MOD_EMU_DEVICE_MEMORY");
    mem->capacity = v && *v ? std::strtoull(v, nullptr, 10) : size_t{16} << 30;
    const char* p = std::getenv("MOD_EMU_PROTECT");
    mem->protect = !(p && std::strcmp(p, "0") == 0);
    return mem;
  }();
  return *m;
}

size_t page() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

size_t round_up(size_t n, size_t unit) {
  return (n + unit - 1) / unit * unit;
}

// The allocation holding [p, p + bytes), else nullptr.
const std::pair<const uintptr_t, Allocation>* find(const std::map<uintptr_t, Allocation>& m,
                                                   const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return nullptr;
  --it;
  if (a + bytes > it->first + it->second.bytes || (bytes == 0 && a > it->first + it->second.bytes))
    return nullptr;
  return &*it;
}

bool pinned(const void* p, size_t bytes) {
  const Memory& m = memory();
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = m.pinned.upper_bound(a);
  if (it == m.pinned.begin()) return false;
  --it;
  return a + bytes <= it->first + it->second;
}

enum class Side { kDevice, kPinned, kPageable };

Side side(const void* p, size_t bytes) {
  if (find(memory().device, p, bytes)) return Side::kDevice;
  return pinned(p, bytes) ? Side::kPinned : Side::kPageable;
}

struct sigaction previous_segv;

void set_access(const Allocation& a, bool open) {
  mprotect(a.pages, a.pages_bytes, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

// Raised synchronously by this thread's own access, never while the maps change. In device work,
// a touch of a closed allocation opens it; anything else is reported, and the signal handed to
// whoever had it (Catch2's report, or the default) by returning with the old action restored.
void on_segv(int, siginfo_t* info, void*) {
  Memory& m = memory();
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  if (m.device_depth > 0 && m.opened.size() < m.opened.capacity()) {
    auto it = m.device.upper_bound(at);
    if (it != m.device.begin()) {
      --it;
      const Allocation& a = it->second;
      const auto first = reinterpret_cast<uintptr_t>(a.pages);
      if (at >= first && at < first + a.pages_bytes) {
        set_access(a, true);
        m.opened.push_back(&a);
        return;
      }
    }
  }
  static const char text[] =
      "emulator: segmentation fault: the host touched device memory (only kernels, copies and "
      "library calls may), or a kernel ran past an allocation into its guard page\n";
  if (write(2, text, sizeof text - 1) < 0) {
  }
  sigaction(SIGSEGV, &previous_segv, nullptr);
}

// Ours must see a fault first; a test framework may have put its own in front since (Catch2
// does at every test case), so this is checked whenever device work begins.
void install_segv_handler() {
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_segv) return;
  struct sigaction action {};
  action.sa_sigaction = on_segv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &previous_segv);
}

cudaError_t allocate(void** ptr, size_t bytes) {
  Memory& m = memory();
  const size_t data = round_up(bytes == 0 ? 1 : bytes, 256);
  if (m.in_use + data > m.capacity) return cudaErrorMemoryAllocation;
  const size_t pages = round_up(data, page());
  const size_t total = pages + 2 * page();
  void* map = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) return cudaErrorMemoryAllocation;
  char* first = static_cast<char*>(map) + page();
  if (mprotect(first, pages, PROT_READ | PROT_WRITE) != 0) {
    munmap(map, total);
    return cudaErrorMemoryAllocation;
  }
  char* p = first + pages - data;
  std::memset(p, 0xFF, data);
  const Allocation a{bytes, map, total, first, pages};
  if (m.protect && m.device_depth == 0) set_access(a, false);
  m.device[reinterpret_cast<uintptr_t>(p)] = a;
  m.in_use += data;
  *ptr = p;
  return cudaSuccess;
}

// A call refused for its arguments: an ordinary error (not sticky), said on stderr since the
// code alone (cudaErrorInvalidValue) does not say which argument.
void refused(const char* what, const std::string& why) {
  std::fprintf(stderr, "emulator: %s refused: %s\n", what, why.c_str());
}

cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                       cudaStream_t stream, const char* what) {
  const Side to = side(dst, bytes), from = side(src, bytes);
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing); an explicit
  // kind that does not match them is undefined behaviour in CUDA, an error here.
  const bool dev_dst = to == Side::kDevice, dev_src = from == Side::kDevice;
  bool matches = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      matches = !dev_src && dev_dst;
      break;
    case cudaMemcpyDeviceToHost:
      matches = dev_src && !dev_dst;
      break;
    case cudaMemcpyDeviceToDevice:
      matches = dev_src && dev_dst;
      break;
    case cudaMemcpyHostToHost:
      matches = !dev_src && !dev_dst;
      break;
    case cudaMemcpyDefault:
      break;
    default:
      return record_error(cudaErrorInvalidMemcpyDirection);
  }
  if (!matches) {
    refused(what, std::string("the pointers do not match the copy's kind ") +
                      std::to_string(static_cast<int>(kind)) + " (a device pointer must lie in " +
                      "one live cudaMalloc allocation, " + std::to_string(bytes) + " bytes long)");
    return record_error(cudaErrorInvalidValue);
  }
  if ((to == Side::kPageable || from == Side::kPageable) && (dev_dst || dev_src) &&
      capturing(stream))
    return capture_violation(stream, std::string(what) + " with pageable host memory");
  return cudaSuccess;
}

// Queues a copy with the API's synchronization rules for late streams (CUDA Runtime API, "API
// synchronization behavior", the Async column): pageable host memory is staged at once, so the
// host may reuse it on return; a copy into pageable memory returns only once it has completed;
// pinned memory is read and written when the copy runs. `copy(source)` copies from source
// (src or its staged bytes).
// The copy's name with its direction, as the CUPTI stand-in reports it.
const char* copy_name(bool two_d, Side to, Side from) {
  const bool d_to = to == Side::kDevice, d_from = from == Side::kDevice;
  if (two_d)
    return d_from ? (d_to ? "cudaMemcpy2DAsync DtoD" : "cudaMemcpy2DAsync DtoH")
                  : (d_to ? "cudaMemcpy2DAsync HtoD" : "cudaMemcpy2DAsync HtoH");
  return d_from ? (d_to ? "cudaMemcpyAsync DtoD" : "cudaMemcpyAsync DtoH")
                : (d_to ? "cudaMemcpyAsync HtoD" : "cudaMemcpyAsync HtoH");
}

cudaError_t enqueue_copy(cudaStream_t stream, bool two_d, Side to, const void* src, Side from,
                         size_t src_bytes, std::function<void(const void*)> copy) {
  const char* what = copy_name(two_d, to, from);
  if (from == Side::kPageable && !capturing(stream) && late_streams()) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + src_bytes);
    return enqueue(stream, what, [staged, copy] { copy(staged->data()); });
  }
  const cudaError_t rc = enqueue(stream, what, [src, copy] { copy(src); });
  if (rc == cudaSuccess && to == Side::kPageable && !capturing(stream)) run_pending();
  return rc;
}

}  // namespace

void enter_device() {
  Memory& m = memory();
  // The handler may not allocate: room for every allocation to open.
  if (m.device_depth++ != 0 || !m.protect) return;
  install_segv_handler();
  if (m.opened.capacity() < m.device.size() + 64) m.opened.reserve(2 * m.device.size() + 64);
}

void leave_device() {
  Memory& m = memory();
  if (--m.device_depth != 0) return;
  for (const Allocation* a : m.opened) set_access(*a, false);
  m.opened.clear();
}

}  // namespace emu::rt::detail

namespace emu::rt {

cudaError_t device_malloc(void** ptr, size_t bytes, const char* what) {
  std::lock_guard lock(detail::mutex());
  if (detail::unsafe_call_prohibited()) return detail::unsafe_call(what);
  return detail::record_error(detail::allocate(ptr, bytes));
}

bool device_range(const void* ptr, size_t bytes) {
  std::lock_guard lock(detail::mutex());
  return detail::find(detail::memory().device, ptr, bytes) != nullptr;
}

}  // namespace emu::rt

using namespace emu::rt;
using namespace emu::rt::detail;

extern "C" {

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return record_error(cudaErrorInvalidValue);
  std::lock_guard lock(mutex());
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (unsafe_call_prohibited()) return unsafe_call("cudaMalloc");
  return record_error(allocate(ptr, bytes));
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaFree");
  Memory& m = memory();
  const auto it = m.device.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.device.end()) return record_error(cudaErrorInvalidDevicePointer);
  run_pending();  // cudaFree synchronises the device: queued work may still use the memory
  m.in_use -= round_up(it->second.bytes == 0 ? 1 : it->second.bytes, 256);
  std::erase(m.opened, &it->second);
  munmap(it->second.mapping, it->second.mapping_bytes);
  m.device.erase(it);
  return sticky_error();
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  if (ptr == nullptr) return record_error(cudaErrorInvalidValue);
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaMallocHost");
  void* p = std::aligned_alloc(256, round_up(bytes == 0 ? 1 : bytes, 256));
  if (p == nullptr) return record_error(cudaErrorMemoryAllocation);
  memory().pinned[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int /*flags*/) {
  return cudaMallocHost(ptr, bytes);
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard lock(mutex());
  run_pending();  // as cudaFree: a queued copy may still use the memory
  if (memory().pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 0)
    return record_error(cudaErrorInvalidValue);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard lock(mutex());
  *free_bytes = memory().capacity - memory().in_use;
  *total_bytes = memory().capacity;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (bytes == 0) return cudaSuccess;
  if (const cudaError_t e = check_copy(dst, src, bytes, kind, stream, "cudaMemcpyAsync");
      e != cudaSuccess)
    return e;
  return enqueue_copy(stream, false, side(dst, bytes), src, side(src, bytes),
                      bytes, [=](const void* from) { std::memmove(dst, from, bytes); });
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaMemcpy");
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (width > dpitch || width > spitch) return record_error(cudaErrorInvalidPitchValue);
  if (width == 0 || height == 0) return cudaSuccess;
  // Each side's extent: height - 1 pitches and one row.
  const size_t dst_bytes = (height - 1) * dpitch + width, src_bytes = (height - 1) * spitch + width;
  const Side to = side(dst, dst_bytes), from = side(src, src_bytes);
  if ((kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice) && to != Side::kDevice)
    return record_error(cudaErrorInvalidValue);
  if ((kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost) && from != Side::kDevice)
    return record_error(cudaErrorInvalidValue);
  if ((to == Side::kPageable || from == Side::kPageable) &&
      (to == Side::kDevice || from == Side::kDevice) && capturing(stream))
    return capture_violation(stream, "cudaMemcpy2DAsync with pageable host memory");
  return enqueue_copy(stream, true, to, src, from, src_bytes,
                      [=](const void* source) {
                        for (size_t r = 0; r < height; ++r)
                          std::memmove(static_cast<char*>(dst) + r * dpitch,
                                       static_cast<const char*>(source) + r * spitch, width);
                      });
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (sticky_error() != cudaSuccess) return sticky_error();
  if (bytes == 0) return cudaSuccess;
  if (!find(memory().device, ptr, bytes)) {
    refused("cudaMemsetAsync",
            std::to_string(bytes) + " bytes do not lie in one cudaMalloc allocation");
    return record_error(cudaErrorInvalidValue);
  }
  return enqueue(stream, "cudaMemsetAsync", [=] { std::memset(ptr, value, bytes); });
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaMemset");
  return cudaMemsetAsync(ptr, value, bytes, nullptr);
}

}  // extern "C"
