// Size-keyed cache of freed host blocks (see host_allocator.h).
#include "core/cpu/host_allocator.h"

#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

namespace mod::cpu {

namespace {
constexpr size_t kAlignment = 64;
constexpr size_t kCachedFrom = 64 * 1024;  // smaller blocks: malloc's own bins do well

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  size_t cached = 0;
  size_t limit = 0;
};

// Leaked on purpose: tensors in static storage may be freed after any static destructor.
Cache& cache() {
  static Cache* c = [] {
    auto* c = new Cache;
    if (const char* mb = std::getenv("MOD_HOST_CACHE_MB")) {
      c->limit = static_cast<size_t>(std::stoull(mb)) << 20;
    } else {
      const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      c->limit = pages > 0 && page > 0 ? static_cast<size_t>(pages) * page / 4 : size_t{1} << 30;
    }
    return c;
  }();
  return *c;
}

size_t rounded(size_t bytes) {
  const size_t unit = bytes >= kCachedFrom ? 4096 : kAlignment;
  return bytes == 0 ? kAlignment : (bytes + unit - 1) / unit * unit;
}
}  // namespace

void* host_allocate(size_t bytes) {
  const size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(size);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= size;
      return p;
    }
  }
  void* p = std::aligned_alloc(kAlignment, size);
  if (!p) throw std::bad_alloc();
  return p;
}

void host_deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t size = rounded(bytes);
  if (size >= kCachedFrom) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.cached + size <= c.limit) {
      c.free_blocks[size].push_back(ptr);
      c.cached += size;
      return;
    }
  }
  std::free(ptr);
}

size_t host_cached_bytes() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.cached;
}

size_t host_cache_limit() { return cache().limit; }

}  // namespace mod::cpu
