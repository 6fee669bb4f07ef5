// The calls the intrinsics make into the block scheduler (emulator/src/block.cpp). Each may suspend
// the calling fiber until its partners arrive; each records its call site so an error names it.
// Only valid inside a kernel launched by emu::launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <source_location>

namespace emu::detail {

enum class Collective : uint8_t {
  kSyncwarp,
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll
};
enum class BarrierOp : uint8_t { kSync, kCount, kAnd, kOr };

// Meets the lanes of `mask`; returns this lane's result (the shuffled bits, the ballot).
uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int arg, int width,
                         const std::source_location& site);
// Meets every thread of the block at one __syncthreads; returns the reduced predicate.
int block_barrier(BarrierOp op, int predicate, const std::source_location& site);
unsigned active_mask(const std::source_location& site);
// A suspension point at an atomic, under Options::random_schedule with yield_at_atomics.
void atomic_point();
[[noreturn]] void trap(const std::source_location& site);

}  // namespace emu::detail
