// Fibers: an execution context per CUDA thread and the stacks they run on. A context is
// switched to only from the host thread that made it; stacks come from a per-host-thread pool,
// each with a guard page below it, and are reused by every block that host thread runs.
#pragma once

#include <cstddef>
#include <vector>

#if defined(MOD_EMU_UCONTEXT)
#include <ucontext.h>
#endif

namespace emu::detail {

inline constexpr size_t kStackBytes = 128 * 1024;

struct Context {
#if defined(MOD_EMU_UCONTEXT)
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
};

struct Stack {
  char* base = nullptr;  // lowest usable byte; the guard page lies below it
  size_t bytes = 0;
};

// Prepares `context` to run entry() on `stack` at the next switch to it; entry never returns.
void context_make(Context& context, Stack stack, void (*entry)());
// Saves the running context in `from` and resumes `to`.
void context_switch(Context& from, Context& to);

class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool&) = delete;
  StackPool& operator=(const StackPool&) = delete;
  ~StackPool();
  // The i-th stack, mapped on first use.
  Stack get(size_t i);

 private:
  std::vector<Stack> stacks_;
};

}  // namespace emu::detail
