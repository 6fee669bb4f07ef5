// Size-keyed cache of freed host blocks (see host_allocator.h).
#include "core/cpu/host_allocator.h"

#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
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

// MOD_HOST_CACHE_MB: whole MiB, 0 to 2^40; anything else names the variable.
size_t parse_cache_mb(const char* text) {
  uint64_t mb = 0;
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, mb);
  if (ec != std::errc() || ptr != end || ptr == text || mb > (uint64_t{1} << 40))
    throw std::invalid_argument("environment: MOD_HOST_CACHE_MB='" + std::string(text) +
                                "': expected whole MiB from 0 to 2^40");
  return static_cast<size_t>(mb);
}

// Leaked on purpose: tensors in static storage may be freed after any static destructor.
Cache& cache() {
  static Cache* c = [] {
    auto* c = new Cache;
    if (const char* mb = std::getenv("MOD_HOST_CACHE_MB")) {
      c->limit = parse_cache_mb(mb) << 20;
    } else {
      const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      c->limit = pages > 0 && page > 0 ? static_cast<size_t>(pages) * page / 4 : size_t{1} << 30;
    }
    return c;
  }();
  return *c;
}

std::atomic<size_t> in_use{0}, peak{0};

void count_allocated(size_t size) {
  const size_t now = in_use.fetch_add(size, std::memory_order_relaxed) + size;
  size_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

size_t rounded(size_t bytes) {
  const size_t unit = bytes >= kCachedFrom ? 4096 : kAlignment;
  return bytes == 0 ? kAlignment : (bytes + unit - 1) / unit * unit;
}
}  // namespace

void* host_allocate(size_t bytes) {
  const size_t size = rounded(bytes);
  count_allocated(size);
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
  if (!p) {
    in_use.fetch_sub(size, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  return p;
}

void host_deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t size = rounded(bytes);
  in_use.fetch_sub(size, std::memory_order_relaxed);
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

size_t host_in_use_bytes() { return in_use.load(std::memory_order_relaxed); }
size_t host_peak_in_use_bytes() { return peak.load(std::memory_order_relaxed); }
void host_reset_peak() { peak.store(in_use.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace mod::cpu
