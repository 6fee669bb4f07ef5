// The test-only hooks (train/test_hooks.h): read from the environment only under
// MOD_TEST_HOOKS=1, ignored (and named in a note) without it, and a bad value is an error that
// names the variable, its value and what was expected.
#include "train/test_hooks.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <map>
#include <string>

using namespace mod;
using Catch::Matchers::Contains;

namespace {
// Sets the hook variables for one test and unsets all of them (and the switch) after it.
class HookEnvironment {
 public:
  explicit HookEnvironment(const std::map<std::string, std::string>& vars) {
    clear();
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~HookEnvironment() { clear(); }

 private:
  static void clear() {
    for (const char* name : {"MOD_TEST_HOOKS", "MOD_FAULT_EXIT_RANK", "MOD_FAULT_EXIT_STEP",
                             "MOD_CHECKPOINT_FAULT", "MOD_CHECK_TP_ROUTING", "MOD_FAULT_NAN_STEP"})
      ::unsetenv(name);
  }
};

const std::map<std::string, std::string> kEveryHook = {{"MOD_FAULT_EXIT_RANK", "1"},
                                                       {"MOD_FAULT_EXIT_STEP", "3"},
                                                       {"MOD_CHECKPOINT_FAULT", "after_metadata"},
                                                       {"MOD_CHECK_TP_ROUTING", "1"},
                                                       {"MOD_FAULT_NAN_STEP", "2"}};
}  // namespace

TEST_CASE("without MOD_TEST_HOOKS=1 every hook is off, and the note names the ones set",
          "[train]") {
  for (const char* off : {"", "0"}) {
    auto vars = kEveryHook;
    if (*off) vars["MOD_TEST_HOOKS"] = off;
    HookEnvironment env(vars);
    INFO("MOD_TEST_HOOKS='" << off << "'");
    std::string note;
    const train::TestHooks hooks = train::read_test_hooks(&note);
    CHECK(hooks.exit_rank == -1);
    CHECK_FALSE(hooks.exits_in(1, 2));
    CHECK(hooks.checkpoint_fault == ckpt::FaultPoint::None);
    CHECK_FALSE(hooks.check_tp_routing);
    CHECK_FALSE(hooks.poisons(1));
    CHECK_THAT(note, Contains("MOD_FAULT_EXIT_RANK, MOD_FAULT_EXIT_STEP, MOD_CHECKPOINT_FAULT, "
                              "MOD_CHECK_TP_ROUTING, MOD_FAULT_NAN_STEP") &&
                         Contains("MOD_TEST_HOOKS=1"));
  }
  HookEnvironment none({});
  std::string note = "stale";
  train::read_test_hooks(&note);
  CHECK(note.empty());  // nothing set, nothing to say
}

TEST_CASE("under MOD_TEST_HOOKS=1 the hooks are read", "[train]") {
  auto vars = kEveryHook;
  vars["MOD_TEST_HOOKS"] = "1";
  HookEnvironment env(vars);
  std::string note;
  const train::TestHooks hooks = train::read_test_hooks(&note);
  CHECK(note.empty());
  CHECK(hooks.exit_rank == 1);
  CHECK(hooks.exit_step == 3);
  CHECK(hooks.exits_in(1, 2));  // 0-based step 2 is the third
  CHECK_FALSE(hooks.exits_in(0, 2));
  CHECK_FALSE(hooks.exits_in(1, 3));
  CHECK(hooks.checkpoint_fault == ckpt::FaultPoint::AfterMetadata);
  CHECK(hooks.check_tp_routing);
  CHECK(hooks.poisons(1));  // 0-based step 1 is the second
  CHECK_FALSE(hooks.poisons(0));
  CHECK_FALSE(hooks.poisons(2));
}

TEST_CASE("a bad test hook value names the variable, the value and what was expected", "[train]") {
  struct Case {
    std::map<std::string, std::string> vars;
    std::string message;
  };
  const Case cases[] = {
      {{{"MOD_TEST_HOOKS", "yes"}}, "MOD_TEST_HOOKS='yes': expected 0 or 1"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_CHECKPOINT_FAULT", "after_shrad"}},
       "MOD_CHECKPOINT_FAULT='after_shrad': expected one of after_shard, after_metadata, "
       "after_rename"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_FAULT_EXIT_RANK", "1"}, {"MOD_FAULT_EXIT_STEP", "0"}},
       "MOD_FAULT_EXIT_STEP='0': expected a whole number >= 1"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_FAULT_EXIT_RANK", "one"}, {"MOD_FAULT_EXIT_STEP", "2"}},
       "MOD_FAULT_EXIT_RANK='one': expected a whole number >= 0"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_FAULT_EXIT_RANK", "1"}},
       "MOD_FAULT_EXIT_RANK and MOD_FAULT_EXIT_STEP go together"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_CHECK_TP_ROUTING", "true"}},
       "MOD_CHECK_TP_ROUTING='true': expected 0 or 1"},
      {{{"MOD_TEST_HOOKS", "1"}, {"MOD_FAULT_NAN_STEP", "0"}},
       "MOD_FAULT_NAN_STEP='0': expected a whole number >= 1"},
  };
  for (const Case& c : cases) {
    HookEnvironment env(c.vars);
    INFO(c.message);
    CHECK_THROWS_WITH(train::read_test_hooks(), Contains(c.message));
  }
}
