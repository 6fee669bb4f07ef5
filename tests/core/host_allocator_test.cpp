// The host allocator: aligned blocks, large freed blocks reused by size, small ones not cached.
#include <catch2/catch.hpp>

#include <cstdint>

#include "core/backend.h"
#include "core/cpu/host_allocator.h"
#include "core/tensor.h"

using namespace mod;

TEST_CASE("large freed blocks are reused for the same size, all blocks are aligned", "[tensor]") {
  const size_t big = 3 * 1024 * 1024 + 17;
  void* a = cpu::host_allocate(big);
  CHECK(reinterpret_cast<uintptr_t>(a) % 64 == 0);
  const size_t before = cpu::host_cached_bytes();
  cpu::host_deallocate(a, big);
  CHECK(cpu::host_cached_bytes() > before);
  void* b = cpu::host_allocate(big);
  CHECK(b == a);  // the cached block comes back
  CHECK(cpu::host_cached_bytes() == before);
  cpu::host_deallocate(b, big);

  void* small = cpu::host_allocate(100);
  CHECK(reinterpret_cast<uintptr_t>(small) % 64 == 0);
  const size_t cached = cpu::host_cached_bytes();
  cpu::host_deallocate(small, 100);
  CHECK(cpu::host_cached_bytes() == cached);  // small blocks go back to malloc
  CHECK(cpu::host_cache_limit() > 0);
}

TEST_CASE("tensors of a repeated shape reuse their storage", "[tensor]") {
  const void* first;
  {
    Tensor t = Tensor::empty({512, 1024});
    first = t.raw_data();
  }
  Tensor again = Tensor::empty({512, 1024});
  CHECK(again.raw_data() == first);
}

TEST_CASE("in-use bytes count live blocks, not cached ones, the peak resets to what is in use",
          "[tensor]") {
  const size_t big = 2 * 1024 * 1024;  // cached when freed
  const size_t base = cpu::host_in_use_bytes();
  cpu::host_reset_peak();
  CHECK(cpu::host_peak_in_use_bytes() == base);
  void* a = cpu::host_allocate(big);
  void* b = cpu::host_allocate(big);
  CHECK(cpu::host_in_use_bytes() == base + 2 * big);
  cpu::host_deallocate(a, big);
  CHECK(cpu::host_in_use_bytes() == base + big);  // a sits in the cache: not in use
  CHECK(cpu::host_peak_in_use_bytes() == base + 2 * big);
  cpu::host_reset_peak();
  CHECK(cpu::host_peak_in_use_bytes() == base + big);
  const MemoryStats s = backend(Device::CPU).memory_stats();
  CHECK(s.in_use_bytes == base + big);
  CHECK(s.peak_in_use_bytes == base + big);
  cpu::host_deallocate(b, big);
  CHECK(cpu::host_in_use_bytes() == base);
}
