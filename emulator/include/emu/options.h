// What a launch returns (Status: a CUDA-numbered code and a message naming kernel, block and
// thread) and the checking modes (Options), set per launch or process-wide. Defaults run blocks
// in order with a round-robin schedule and no poisoning; barrier checks are always on.
#pragma once

#include <cstdint>
#include <string>

namespace emu {

// Codes keep cudaError_t's numbers where CUDA has the error; kSynccheck is the emulator's own.
enum class ErrorCode : int {
  kSuccess = 0,
  kInvalidValue = 1,          // cudaErrorInvalidValue: dynamic shared memory over the limit
  kInvalidConfiguration = 9,  // cudaErrorInvalidConfiguration: grid or block dims
  kLaunchFailure = 719,       // cudaErrorLaunchFailure: __trap(), or the kernel threw
  kSynccheck = 100000,        // a barrier or warp collective misused (compute-sanitizer synccheck)
};

struct Status {
  ErrorCode code = ErrorCode::kSuccess;
  std::string message;  // empty on success
  bool ok() const { return code == ErrorCode::kSuccess; }
};

const char* error_name(ErrorCode code);

struct Options {
  // At every suspension point (barrier, warp collective) the next thread to run is drawn from
  // the runnable ones by a PRNG seeded with `seed`; blocks run in a seeded random order.
  bool random_schedule = false;
  uint64_t seed = 0;
  // Under random_schedule, every atomic is a suspension point too.
  bool yield_at_atomics = false;
  // Dynamic shared memory filled with kPoisonByte before each block (0xFF: NaN as a float, -1
  // as an integer). Static __shared__ is not poisoned (README.md says why).
  bool poison_shared = false;
  // The Programming Guide excuses exited lanes named in a warp mask ("all non-exited threads
  // named in mask must execute the same intrinsic"); by default the emulator does not, since a
  // value read from an exited lane is undefined. When true, they are excused and read as poison.
  bool excuse_exited_lanes = false;
};

inline constexpr unsigned char kPoisonByte = 0xFF;

// The options launches use when they pass none; not thread-safe against running launches.
Options& default_options();

}  // namespace emu
