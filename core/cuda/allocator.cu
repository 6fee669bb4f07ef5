// Caching device allocator: sizes rounded up (512 B below 1 MiB, 2 MiB above), freed blocks
// kept per rounded size and reused; on out-of-memory the cache is released and cudaMalloc tried
// once more. Blocks belong to a pool: 0, the general one, or a captured graph's private pool.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <stdexcept>
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

struct Block {
  size_t size = 0;
  int pool = 0;
};

struct Cache {
  std::mutex mutex;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_blocks;  // (pool, size) -> blocks
  std::unordered_map<void*, Block> blocks;  // every live or cached block
  int capturing = 0;                        // the pool being captured into, 0: none
  int next_pool = 1;
  AllocatorStats stats;

  // A cached block of `pool` of exactly `size` bytes, or nullptr.
  void* take_cached(int pool, size_t size) {
    auto it = free_blocks.find({pool, size});
    if (it == free_blocks.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    stats.cached_bytes -= size;
    return p;
  }

  // Frees the general pool's cached blocks (graph pools keep theirs: their graphs use them).
  void release_locked() {
    for (auto it = free_blocks.begin(); it != free_blocks.end();) {
      if (it->first.first != 0) {
        ++it;
        continue;
      }
      for (void* p : it->second) {
        cudaFree(p);
        blocks.erase(p);
        stats.cached_bytes -= it->first.second;
      }
      it = free_blocks.erase(it);
    }
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
  // While a graph is captured every block comes from its pool: the graph bakes the addresses in.
  // A capture takes the general pool's cached blocks too (a replay runs on the compute stream
  // after whatever was queued with them): without that every capture, a re-capture after a
  // resume or a second run in one process, would cudaMalloc its whole footprint anew.
  const int pool = c.capturing;
  void* p = c.take_cached(pool, size);
  if (p == nullptr && pool != 0 && (p = c.take_cached(0, size)) != nullptr) c.blocks[p].pool = pool;
  if (p == nullptr) {
    // cudaMalloc is a "potentially unsafe" call inside a capture (it is not captured): allowed
    // here by switching this thread to relaxed mode around it, since the graph's pool keeps the
    // block for as long as the graph lives.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (pool != 0) cudaThreadExchangeStreamCaptureMode(&mode);
    cudaError_t err = cudaMalloc(&p, size);
    if (pool != 0) cudaThreadExchangeStreamCaptureMode(&mode);
    if (err == cudaErrorMemoryAllocation && pool == 0) {  // no synchronising inside a capture
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
    c.blocks[p] = {size, pool};
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
  Block& b = c.blocks.at(ptr);
  // A block freed during a capture may have been used by captured kernels: it joins the graph's
  // pool, so no eager tensor takes it while the graph can still replay.
  if (c.capturing != 0) b.pool = c.capturing;
  const size_t size = b.size;
  c.free_blocks[{b.pool, size}].push_back(ptr);
  c.stats.in_use_bytes -= size;
  c.stats.cached_bytes += size;
}

AllocatorStats allocator_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void reset_peak_in_use() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.peak_in_use_bytes = c.stats.in_use_bytes;
}

int begin_graph_pool() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.capturing != 0) throw std::logic_error("CUDA graph capture: already capturing");
  c.capturing = c.next_pool++;
  return c.capturing;
}

void end_graph_pool() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.capturing = 0;
}

void release_graph_pool(int pool) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.capturing == pool) c.capturing = 0;
  // Every block of the pool, cached or still held by a tensor, becomes the general pool's.
  for (auto& [p, b] : c.blocks)
    if (b.pool == pool) b.pool = 0;
  for (auto it = c.free_blocks.begin(); it != c.free_blocks.end();) {
    if (it->first.first != pool) {
      ++it;
      continue;
    }
    auto& general = c.free_blocks[{0, it->first.second}];
    general.insert(general.end(), it->second.begin(), it->second.end());
    it = c.free_blocks.erase(it);
  }
}

void release_cached() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  MOD_CUDA_CHECK(cudaStreamSynchronize(compute_stream()));
  c.release_locked();
}

}  // namespace mod::cuda
