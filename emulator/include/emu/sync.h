// Block-level synchronisation: __syncthreads and its predicate forms, memory fences, __trap.
// CUDA C++ Programming Guide, "Synchronization Functions": __syncthreads "waits until all
// threads in the thread block have reached this point", allowed in conditional code "only if the
// conditional evaluates identically across the entire thread block". The emulator enforces it
// as written: a barrier completes when every thread of the block waits at the same __syncthreads
// call site; a thread that exits, or waits at another site or a warp collective, while others
// wait is a kSynccheck error naming both (emulator/src/block.cpp).
#pragma once

#include <atomic>
#include <source_location>

#include "emu/scheduler.h"

inline void __syncthreads(std::source_location site = std::source_location::current()) {
  emu::detail::block_barrier(emu::detail::BarrierOp::kSync, 0, site);
}
inline int __syncthreads_count(int predicate,
                               std::source_location site = std::source_location::current()) {
  return emu::detail::block_barrier(emu::detail::BarrierOp::kCount, predicate, site);
}
inline int __syncthreads_and(int predicate,
                             std::source_location site = std::source_location::current()) {
  return emu::detail::block_barrier(emu::detail::BarrierOp::kAnd, predicate, site);
}
inline int __syncthreads_or(int predicate,
                            std::source_location site = std::source_location::current()) {
  return emu::detail::block_barrier(emu::detail::BarrierOp::kOr, predicate, site);
}

// Fibers of a block share one host thread, so fences only matter to other host threads.
inline void __threadfence_block() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}
inline void __threadfence_system() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

[[noreturn]] inline void __trap(std::source_location site = std::source_location::current()) {
  emu::detail::trap(site);
}
