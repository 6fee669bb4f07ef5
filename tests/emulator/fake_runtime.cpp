// The fake runtime of fake_runtime.h, implementing emulator/include/emu/runtime.h for blas_test.cpp.
#include "tests/emulator/fake_runtime.h"

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <vector>

#include "emu/runtime.h"

namespace {
bool capturing_now = false;
std::vector<std::function<void()>> graph;
std::map<uintptr_t, size_t> allocations;  // start -> bytes
cudaError_t sticky = cudaSuccess;
std::string sticky_text;
}  // namespace

namespace emu::fake {
void set_capturing(bool on) {
  capturing_now = on;
}
void replay() {
  for (auto& work : graph) work();
  graph.clear();
}
size_t recorded() {
  return graph.size();
}
void device_free(void* p) {
  allocations.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
}
int sticky_code() {
  return static_cast<int>(sticky);
}
std::string sticky_message() {
  return sticky_text;
}
void clear_sticky() {
  sticky = cudaSuccess;
  sticky_text.clear();
}
}  // namespace emu::fake

namespace emu::rt {

cudaError_t enqueue(cudaStream_t, const char*, std::function<void()> work) {
  if (sticky != cudaSuccess) return sticky;
  if (capturing_now)
    graph.push_back(std::move(work));
  else
    work();
  return cudaSuccess;
}

bool capturing(cudaStream_t) {
  return capturing_now;
}

cudaError_t capture_violation(cudaStream_t, const std::string&) {
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t device_malloc(void** ptr, size_t bytes, const char*) {
  if (capturing_now) return cudaErrorStreamCaptureUnsupported;
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return cudaSuccess;
}

bool device_range(const void* ptr, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

void fail_sticky(cudaError_t code, const std::string& message) {
  if (sticky == cudaSuccess) {
    sticky = code;
    sticky_text = message;
  }
}

}  // namespace emu::rt
