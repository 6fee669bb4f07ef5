// CUDA's atomic functions (CUDA C++ Programming Guide, "Atomic Functions"): each reads the old
// value, stores the new one and returns the old. The fibers of a block are cooperative and
// blocks run one at a time, so a plain read-modify-write is atomic; every call passes through
// atomic_point, a suspension point under Options::yield_at_atomics.
#pragma once

#include <algorithm>

#include "emu/cuda_types.h"
#include "emu/scheduler.h"

namespace emu::detail {
template <typename T, typename F>
inline T atomic_rmw(T* address, F update) {
  atomic_point();
  const T old = *address;
  *address = update(old);
  return old;
}
// bf16 adds as sm_90's red.add.bf16: the exact sum rounded once to nearest even (the float sum
// of two bf16 values rounded to bf16 is that, float having over 2 * 8 + 2 bits).
inline __nv_bfloat16 bf16_add(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16(__bfloat162float(a) + __bfloat162float(b));
}
}  // namespace emu::detail

#define MOD_EMU_ATOMIC(name, T, expr)                                                             \
  inline T name(T* address, T val) {                                                              \
    return emu::detail::atomic_rmw(address, [val]([[maybe_unused]] T old) -> T { return expr; }); \
  }
MOD_EMU_ATOMIC(atomicAdd, int, old + val)
MOD_EMU_ATOMIC(atomicAdd, unsigned int, old + val)
MOD_EMU_ATOMIC(atomicAdd, unsigned long long, old + val)
MOD_EMU_ATOMIC(atomicAdd, float, old + val)
MOD_EMU_ATOMIC(atomicAdd, double, old + val)
MOD_EMU_ATOMIC(atomicAdd, __nv_bfloat16, emu::detail::bf16_add(old, val))
MOD_EMU_ATOMIC(atomicSub, int, old - val)
MOD_EMU_ATOMIC(atomicSub, unsigned int, old - val)
MOD_EMU_ATOMIC(atomicExch, int, val)
MOD_EMU_ATOMIC(atomicExch, unsigned int, val)
MOD_EMU_ATOMIC(atomicExch, unsigned long long, val)
MOD_EMU_ATOMIC(atomicExch, float, val)
MOD_EMU_ATOMIC(atomicMax, int, std::max(old, val))
MOD_EMU_ATOMIC(atomicMax, unsigned int, std::max(old, val))
MOD_EMU_ATOMIC(atomicMax, long long, std::max(old, val))
MOD_EMU_ATOMIC(atomicMax, unsigned long long, std::max(old, val))
MOD_EMU_ATOMIC(atomicMin, int, std::min(old, val))
MOD_EMU_ATOMIC(atomicMin, unsigned int, std::min(old, val))
MOD_EMU_ATOMIC(atomicMin, long long, std::min(old, val))
MOD_EMU_ATOMIC(atomicMin, unsigned long long, std::min(old, val))
MOD_EMU_ATOMIC(atomicAnd, int, old& val)
MOD_EMU_ATOMIC(atomicAnd, unsigned int, old& val)
MOD_EMU_ATOMIC(atomicAnd, unsigned long long, old& val)
MOD_EMU_ATOMIC(atomicOr, int, old | val)
MOD_EMU_ATOMIC(atomicOr, unsigned int, old | val)
MOD_EMU_ATOMIC(atomicOr, unsigned long long, old | val)
MOD_EMU_ATOMIC(atomicXor, int, old ^ val)
MOD_EMU_ATOMIC(atomicXor, unsigned int, old ^ val)
MOD_EMU_ATOMIC(atomicXor, unsigned long long, old ^ val)
// ((old >= val) ? 0 : (old + 1)) and (((old == 0) || (old > val)) ? val : (old - 1)), as the Guide.
MOD_EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
MOD_EMU_ATOMIC(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)
#undef MOD_EMU_ATOMIC

// Both halves added, each rounded once; sm_90 makes the pair one 32-bit atomic.
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* address, __nv_bfloat162 val) {
  return emu::detail::atomic_rmw(address, [val](__nv_bfloat162 old) {
    return __nv_bfloat162(emu::detail::bf16_add(old.x, val.x), emu::detail::bf16_add(old.y, val.y));
  });
}

#define MOD_EMU_ATOMIC_CAS(T)                                                               \
  inline T atomicCAS(T* address, T compare, T val) {                                        \
    return emu::detail::atomic_rmw(address,                                                 \
                                   [=](T old) -> T { return old == compare ? val : old; }); \
  }
MOD_EMU_ATOMIC_CAS(int)
MOD_EMU_ATOMIC_CAS(unsigned int)
MOD_EMU_ATOMIC_CAS(unsigned long long)
MOD_EMU_ATOMIC_CAS(unsigned short)
#undef MOD_EMU_ATOMIC_CAS
