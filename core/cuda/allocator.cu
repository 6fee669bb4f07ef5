// Caching device allocator: sizes rounded up (512 B below 1 MiB, 2 MiB above), freed blocks
// kept per rounded size and reused; on out-of-memory the cache is released and cudaMalloc tried
// once more.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"

namespace mod::cuda {

namespace {
size_t round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  if (bytes == 0) bytes = 1;
  const size_t unit = bytes < kSmallLimit ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

struct Cache {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free_blocks;  // rounded size -> blocks
  std::unordered_map<void*, size_t> sizes;           // every live or cached block
  AllocatorStats stats;

  void release_locked() {
    for (auto& [size, blocks] : free_blocks)
      for (void* p : blocks) {
        cudaFree(p);
        sizes.erase(p);
        stats.cached_bytes -= size;
      }
    free_blocks.clear();
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // leaked: see stream.cu
  return *c;
}
}  // namespace

void* device_allocate(size_t bytes) {
  current_device();  // selects the device before the first cudaMalloc
  const size_t size = round_size(bytes);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.free_blocks.find(size);
  void* p = nullptr;
  if (it != c.free_blocks.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    c.stats.cached_bytes -= size;
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      // Blocks freed by the host may still be read by queued kernels: drain before cudaFree.
      cudaStreamSynchronize(compute_stream());
      c.release_locked();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw std::runtime_error("CUDA: out of device memory allocating " + std::to_string(bytes) +
                               " bytes (" + std::to_string(c.stats.in_use_bytes >> 20) +
                               " MiB in use): " + cudaGetErrorString(err));
    }
    c.sizes[p] = size;
    ++c.stats.device_mallocs;
  }
  c.stats.in_use_bytes += size;
  if (c.stats.in_use_bytes > c.stats.peak_in_use_bytes)
    c.stats.peak_in_use_bytes = c.stats.in_use_bytes;
  return p;
}

void device_deallocate(void* ptr, size_t /*bytes*/) {
  if (ptr == nullptr) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const size_t size = c.sizes.at(ptr);
  c.free_blocks[size].push_back(ptr);
  c.stats.in_use_bytes -= size;
  c.stats.cached_bytes += size;
}

AllocatorStats allocator_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void release_cached() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  MOD_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  c.release_locked();
}

}  // namespace mod::cuda
