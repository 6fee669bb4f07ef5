// The checking modes of a process running CUDA code on the emulator, from its environment, set
// before main so every launch sees them (emulator/README.md, "Checking modes"):
//   MOD_EMU_SCHEDULE=random   fibers and blocks in a seeded random order (MOD_EMU_SEED=N)
//   MOD_EMU_POISON=0          leave dynamic shared memory unpoisoned (poisoned by default)
//   MOD_EMU_YIELD_AT_ATOMICS=1  every atomic a suspension point (with the random schedule)
//   MOD_EMU_STREAMS=at_issue  stream work runs when issued, not late (streams.cpp)
// A value other than these is an error naming the variable, and the process exits.
#include "emu/options.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

bool flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  if (std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  std::fprintf(stderr, "emulator: %s=%s: expected 0 or 1\n", name, v);
  std::exit(2);
}

const bool configured = [] {
  emu::Options& o = emu::default_options();
  o.poison_shared = flag("MOD_EMU_POISON", true);
  o.yield_at_atomics = flag("MOD_EMU_YIELD_AT_ATOMICS", false);
  if (const char* s = std::getenv("MOD_EMU_SCHEDULE"); s && *s) {
    if (std::strcmp(s, "random") == 0) {
      o.random_schedule = true;
    } else if (std::strcmp(s, "ordered") != 0) {
      std::fprintf(stderr, "emulator: MOD_EMU_SCHEDULE=%s: expected random or ordered\n", s);
      std::exit(2);
    }
  }
  if (const char* s = std::getenv("MOD_EMU_SEED"); s && *s) {
    char* end = nullptr;
    o.seed = std::strtoull(s, &end, 10);
    if (*end != '\0') {
      std::fprintf(stderr, "emulator: MOD_EMU_SEED=%s: expected a whole number\n", s);
      std::exit(2);
    }
  }
  return true;
}();

const bool late = [] {
  const char* s = std::getenv("MOD_EMU_STREAMS");
  if (s == nullptr || *s == '\0' || std::strcmp(s, "late") == 0) return true;
  if (std::strcmp(s, "at_issue") == 0) return false;
  std::fprintf(stderr, "emulator: MOD_EMU_STREAMS=%s: expected late or at_issue\n", s);
  std::exit(2);
}();

}  // namespace

namespace emu::rt {
// Referenced by the runtime so the linker keeps this file's initialiser in a static library.
bool options_from_environment() {
  return configured;
}
namespace detail {
bool late_streams() {
  return late;
}
}  // namespace detail
}  // namespace emu::rt
