// Test-only hooks from the environment (see test_hooks.h).
#include "train/test_hooks.h"

#include <cstdlib>
#include <stdexcept>

namespace mod::train {

namespace {
constexpr const char* kSwitch = "MOD_TEST_HOOKS";
constexpr const char* kHookVariables[] = {"MOD_FAULT_EXIT_RANK", "MOD_FAULT_EXIT_STEP",
                                          "MOD_CHECKPOINT_FAULT", "MOD_CHECK_TP_ROUTING",
                                          "MOD_FAULT_NAN_STEP"};

// The variable's value; unset and empty are the same ("").
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

[[noreturn]] void bad(const char* name, const std::string& value, const std::string& expected) {
  throw std::invalid_argument(std::string(name) + "='" + value + "': expected " + expected);
}

// A whole decimal number >= least, or an error naming the variable.
int64_t whole_number(const char* name, int64_t least) {
  const std::string v = env(name);
  size_t used = 0;
  int64_t n = -1;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size() || n < least)
    bad(name, v, "a whole number >= " + std::to_string(least));
  return n;
}

bool zero_or_one(const char* name) {
  const std::string v = env(name);
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  bad(name, v, "0 or 1");
}
}  // namespace

TestHooks read_test_hooks(std::string* ignored) {
  if (ignored) ignored->clear();
  TestHooks hooks;
  if (!zero_or_one(kSwitch)) {
    std::string set;
    for (const char* name : kHookVariables)
      if (!env(name).empty()) set += (set.empty() ? "" : ", ") + std::string(name);
    if (ignored && !set.empty())
      *ignored = "modtrain: ignoring " + set + ": test hooks are read only under " + kSwitch + "=1";
    return hooks;
  }
  const bool rank_set = !env("MOD_FAULT_EXIT_RANK").empty();
  if (rank_set != !env("MOD_FAULT_EXIT_STEP").empty())
    throw std::invalid_argument(
        "MOD_FAULT_EXIT_RANK and MOD_FAULT_EXIT_STEP go together: set both or neither");
  if (rank_set) {
    hooks.exit_rank = static_cast<int>(whole_number("MOD_FAULT_EXIT_RANK", 0));
    hooks.exit_step = whole_number("MOD_FAULT_EXIT_STEP", 1);
  }
  if (const std::string v = env("MOD_CHECKPOINT_FAULT"); !v.empty()) {
    hooks.checkpoint_fault = ckpt::parse_fault_point(v);
    if (hooks.checkpoint_fault == ckpt::FaultPoint::None)
      bad("MOD_CHECKPOINT_FAULT", v, "one of after_shard, after_metadata, after_rename");
  }
  hooks.check_tp_routing = zero_or_one("MOD_CHECK_TP_ROUTING");
  if (!env("MOD_FAULT_NAN_STEP").empty()) hooks.nan_step = whole_number("MOD_FAULT_NAN_STEP", 1);
  return hooks;
}

}  // namespace mod::train
