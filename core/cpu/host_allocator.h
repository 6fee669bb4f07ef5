// The CPU backend's memory: 64-byte-aligned blocks, with freed large blocks cached by size. A
// training step allocates the same shapes every step; without the cache each large tensor is a
// fresh mmap whose pages the kernel faults in and zeroes (a 50 MB output costs ~12k faults and
// about a fifth of a 4096x3072x768 GEMM's time).
#pragma once

#include <cstddef>

namespace mod::cpu {

void* host_allocate(size_t bytes);
void host_deallocate(void* ptr, size_t bytes);
// Bytes held in the cache now, and its limit (MOD_HOST_CACHE_MB, default a quarter of RAM).
size_t host_cached_bytes();
size_t host_cache_limit();

// Bytes handed out and not yet freed (sizes as rounded; cached blocks are not in use), and the
// highest that has been since the last reset. Lock-free: every allocation pays two atomics.
size_t host_in_use_bytes();
size_t host_peak_in_use_bytes();
void host_reset_peak();  // the peak restarts from what is in use now (a step boundary)

}  // namespace mod::cpu
