// Fiber contexts and stacks. On x86-64 a switch saves the System V callee-saved registers and
// the MXCSR / x87 control words on the old stack and pops them off the new one (no system call,
// unlike swapcontext's signal mask); MOD_EMU_UCONTEXT selects swapcontext elsewhere.
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace emu::detail {
namespace {
// A reused stack may hold the redzones of frames an earlier fiber left without returning
// (every fiber ends by switching away); AddressSanitizer must not see them as live.
void forget_old_frames([[maybe_unused]] Stack stack) {
#if defined(__SANITIZE_ADDRESS__)
  __asan_unpoison_memory_region(stack.base, stack.bytes);
#endif
}
}  // namespace

#if defined(MOD_EMU_UCONTEXT)

void context_make(Context& context, Stack stack, void (*entry)()) {
  forget_old_frames(stack);
  getcontext(&context.uc);
  context.uc.uc_stack.ss_sp = stack.base;
  context.uc.uc_stack.ss_size = stack.bytes;
  context.uc.uc_link = nullptr;
  makecontext(&context.uc, entry, 0);
}

void context_switch(Context& from, Context& to) {
  swapcontext(&from.uc, &to.uc);
}

#else

extern "C" void mod_emu_switch(void** save_sp, void* load_sp);
extern "C" void mod_emu_start();

// mod_emu_start is where a new context's first switch returns to: r12 holds its entry.
asm(R"(
  .text
  .p2align 4
  .globl mod_emu_switch
  .hidden mod_emu_switch
  .type mod_emu_switch, @function
mod_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size mod_emu_switch, .-mod_emu_switch

  .p2align 4
  .globl mod_emu_start
  .hidden mod_emu_start
  .type mod_emu_start, @function
mod_emu_start:
  .cfi_startproc
  .cfi_undefined rip
  andq $-16, %rsp
  callq *%r12
  ud2
  .cfi_endproc
  .size mod_emu_start, .-mod_emu_start
)");

void context_make(Context& context, Stack stack, void (*entry)()) {
  forget_old_frames(stack);
  auto top = reinterpret_cast<uintptr_t>(stack.base + stack.bytes) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top) - 8;
  // The new context starts with the creating thread's floating-point modes.
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  frame[0] = mxcsr | (uint64_t{fpucw} << 32);
  frame[1] = frame[2] = frame[3] = 0;                     // r15, r14, r13
  frame[4] = reinterpret_cast<uint64_t>(entry);           // r12
  frame[5] = frame[6] = 0;                                // rbx, rbp
  frame[7] = reinterpret_cast<uint64_t>(&mod_emu_start);  // return address
  context.sp = frame;
}

void context_switch(Context& from, Context& to) {
  mod_emu_switch(&from.sp, to.sp);
}

#endif

StackPool::~StackPool() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (const Stack& s : stacks_) munmap(s.base - page, s.bytes + page);
}

Stack StackPool::get(size_t i) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  while (stacks_.size() <= i) {
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("emulator: cannot map a " + std::to_string(kStackBytes / 1024) +
                               " KiB fiber stack: " + std::strerror(errno));
    // The guard page turns a kernel that overflows its stack into a fault, not corruption.
    mprotect(p, page, PROT_NONE);
    stacks_.push_back({static_cast<char*>(p) + page, kStackBytes});
  }
  return stacks_[i];
}

}  // namespace emu::detail
