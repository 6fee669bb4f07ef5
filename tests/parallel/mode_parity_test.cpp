// The MoDE recipes (integrated, staged, and a top-2 token-choice MoE) under expert parallelism
// composed with dp, tp and ZeRO-1, against one process (see parity_harness.h).
#include "tests/support/parity_harness.h"

using mod::test::parity::check_layouts;

TEST_CASE("tiny_mode_integrated: expert-parallel layouts match one process for 10 steps",
          "[mpi][parity]") {
  check_layouts("tiny_mode_integrated", true);
}

TEST_CASE("tiny_mode_staged: expert-parallel layouts match one process for 10 steps", "[mpi][parity]") {
  check_layouts("tiny_mode_staged", true);
}

TEST_CASE("tiny_moe with top-2 token choice: expert-parallel layouts match one process",
          "[mpi][parity]") {
  if (mod::parallel::world().size() == 4) return;  // np2 covers it; np4 runs the MoDE recipes
  check_layouts("tiny_moe_token_choice", true);
}
