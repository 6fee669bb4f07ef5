// Warp-level intrinsics: __syncwarp, the four shuffles, the votes and __activemask.
// CUDA C++ Programming Guide, "Warp Shuffle Functions" and "Warp Vote Functions": "Each calling
// thread must have its own bit set in the mask and all non-exited threads named in mask must
// execute the same intrinsic with the same mask". Here the lanes named in the mask meet (each
// suspends until all have arrived with the same intrinsic and mask), exchange, and continue. A
// named lane that has exited or waits elsewhere forever is a kSynccheck error (Options has the
// Guide's laxer reading for exited lanes). Source lanes follow PTX ISA shfl.sync; a source lane
// outside the mask yields poison bits (0xFF...), where the Guide says "undefined".
#pragma once

#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "emu/builtins.h"
#include "emu/scheduler.h"

namespace emu::detail {
template <typename T>
T shuffle(Collective kind, unsigned mask, T var, int arg, int width,
          const std::source_location& site) {
  // The toolkit's __nv_bfloat162 has a user-written copy constructor, yet is plain bits.
  static_assert(std::is_standard_layout_v<T> && sizeof(T) <= 8,
                "__shfl_*_sync takes values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const void*>(&var), sizeof(T));
  bits = warp_collective(kind, mask, bits, arg, width, site);
  std::memcpy(static_cast<void*>(&var), &bits, sizeof(T));
  return var;
}
}  // namespace emu::detail

inline void __syncwarp(unsigned mask = 0xffffffffu,
                       std::source_location site = std::source_location::current()) {
  emu::detail::warp_collective(emu::detail::Collective::kSyncwarp, mask, 0, 0, warpSize, site);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              std::source_location site = std::source_location::current()) {
  return emu::detail::shuffle(emu::detail::Collective::kShflIdx, mask, var, src_lane, width, site);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 std::source_location site = std::source_location::current()) {
  return emu::detail::shuffle(emu::detail::Collective::kShflUp, mask, var, static_cast<int>(delta),
                              width, site);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   std::source_location site = std::source_location::current()) {
  return emu::detail::shuffle(emu::detail::Collective::kShflDown, mask, var,
                              static_cast<int>(delta), width, site);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  std::source_location site = std::source_location::current()) {
  return emu::detail::shuffle(emu::detail::Collective::kShflXor, mask, var, lane_mask, width, site);
}

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              std::source_location site = std::source_location::current()) {
  return static_cast<unsigned>(emu::detail::warp_collective(emu::detail::Collective::kBallot, mask,
                                                            predicate != 0, 0, warpSize, site));
}
inline int __any_sync(unsigned mask, int predicate,
                      std::source_location site = std::source_location::current()) {
  return static_cast<int>(emu::detail::warp_collective(emu::detail::Collective::kAny, mask,
                                                       predicate != 0, 0, warpSize, site));
}
inline int __all_sync(unsigned mask, int predicate,
                      std::source_location site = std::source_location::current()) {
  return static_cast<int>(emu::detail::warp_collective(emu::detail::Collective::kAll, mask,
                                                       predicate != 0, 0, warpSize, site));
}
// The lanes of the warp that reach this same call site together: the caller waits until no
// thread of its block can run, then sees the lanes waiting here with it (exited lanes: 0 bits).
inline unsigned __activemask(std::source_location site = std::source_location::current()) {
  return emu::detail::active_mask(site);
}
