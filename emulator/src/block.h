// One block of a launch: its CUDA threads as fibers, run cooperatively on the calling host
// thread until all exit or one misuses a barrier. Invariant: exactly one fiber runs at a time,
// and a fiber is in the run queue exactly when its Wait is kReady and it is not running.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "emu/builtins.h"
#include "emu/launch.h"
#include "emu/options.h"
#include "emu/scheduler.h"
#include "fiber.h"
#include "rng.h"

namespace emu::detail {

enum class Wait : uint8_t { kReady, kBarrier, kWarp, kActiveMask, kExited };

struct Thread {
  Context context;
  uint3 idx{};
  int linear = 0;
  Wait wait = Wait::kReady;
  // The call it waits in: its site, and for a warp collective what it brought.
  std::source_location site;
  Collective kind = Collective::kSyncwarp;
  unsigned mask = 0;
  int width = 0;
  int arg = 0;
  uint64_t value = 0;
  uint64_t result = 0;
};

struct WarpState {
  uint32_t present = 0;  // lanes the block has (a partial last warp has fewer)
  uint32_t exited = 0;   // lanes that exited, and lanes not present
  uint32_t waiting = 0;  // lanes suspended in a warp collective
};

struct BlockSetup {
  const char* kernel;
  KernelBody body;
  dim3 block_dim;
  const Options* options;
  uint64_t seed;
};

class Block {
 public:
  Status run(const BlockSetup& setup);
  bool running() const { return setup_ != nullptr; }

  // Called by the running fiber (scheduler.h's functions).
  uint64_t collective(Collective kind, unsigned mask, uint64_t value, int arg, int width,
                      const std::source_location& site);
  int barrier(BarrierOp op, int predicate, const std::source_location& site);
  unsigned active_mask(const std::source_location& site);
  void atomic_point();
  [[noreturn]] void fail(ErrorCode code, const std::string& message);

  // For messages (describe.cpp).
  const std::vector<Thread>& threads() const { return threads_; }
  const std::vector<WarpState>& warps() const { return warps_; }
  int size() const { return n_; }
  std::string where() const;  // "kernel K, block (x,y,z)"

 private:
  static void fiber_entry();
  [[noreturn]] void thread_main();
  [[noreturn]] void exit_running();
  void suspend();
  void push(int linear) { queue_.push_back(linear); }
  void try_complete(int warp, unsigned mask);
  bool resolve_quiescence();
  Thread& lane(int warp, int lane) { return threads_[warp * 32 + lane]; }

  const BlockSetup* setup_ = nullptr;
  int n_ = 0;
  std::vector<Thread> threads_;
  std::vector<WarpState> warps_;
  std::vector<int> queue_;
  size_t head_ = 0;
  Thread* running_ = nullptr;
  Context scheduler_;
  StackPool stacks_;
  Rng rng_;
  int exited_ = 0;
  int barrier_waiting_ = 0;
  int barrier_true_ = 0;
  std::source_location barrier_site_;
  bool failed_ = false;
  Status status_;
};

// The Block of the calling host thread (each host thread runs its own blocks).
Block& this_thread_block();

bool same_site(const std::source_location& a, const std::source_location& b);

}  // namespace emu::detail
