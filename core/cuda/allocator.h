// The CUDA backend's memory: a caching device allocator. cudaMalloc and cudaFree synchronise
// the device and cost tens of microseconds, and a training step allocates the same shapes every
// step, so freed blocks are kept in size-rounded free lists and handed out again. When
// cudaMalloc runs out of memory the cache is released and the allocation retried once.
// Blocks are reused in stream order: every kernel runs on the one stream (stream.h), so a block
// freed by the host can be reused by a later kernel on that stream without waiting.
#pragma once

#include <cstddef>

namespace mod::cuda {

void* device_allocate(size_t bytes);
void device_deallocate(void* ptr, size_t bytes);  // bytes as allocated

struct AllocatorStats {
  size_t in_use_bytes = 0;   // handed out and not yet freed
  size_t cached_bytes = 0;   // freed, kept for reuse
  size_t peak_in_use_bytes = 0;
  size_t device_mallocs = 0;  // cudaMalloc calls so far (a steady training step makes none)
};
AllocatorStats allocator_stats();
void reset_peak_in_use();  // the peak restarts from what is in use now (a step boundary)
// Returns every cached block of the general pool to the driver (cudaFree).
void release_cached();

// CUDA graphs (graph.cu): between begin_graph_pool and end_graph_pool every allocation comes
// from a new private pool, and every block freed joins it; its blocks serve no other allocation
// until release_graph_pool (the graph destroyed) returns them to the general pool.
int begin_graph_pool();
void end_graph_pool();
void release_graph_pool(int pool);

}  // namespace mod::cuda
