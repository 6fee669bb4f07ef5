// Activation recomputation under every np2 layout (dp2, tp2, dp2+ZeRO-1; with MoDE, expert
// parallelism) against one process that keeps every activation (see parity_harness.h): the
// recomputed blocks repeat their tp collectives in backward and their parameters reach the
// gradient buckets from inside a region's backward.
#include "tests/support/parity_harness.h"

using mod::test::parity::check_layouts;
using mod::test::parity::Variant;

TEST_CASE("tiny_mod with FULL recomputation and 2 accumulated micro-batches matches NONE",
          "[mpi][parity][recompute]") {
  check_layouts("tiny_mod", false, Variant{{"train.grad_accum=2"}, {"train.recompute=FULL"}});
}

TEST_CASE("tiny_mod with SELECTIVE recomputation of blocks 0 and 1 matches NONE",
          "[mpi][parity][recompute]") {
  check_layouts("tiny_mod", false,
                Variant{{}, {"train.recompute=SELECTIVE", "train.recompute_blocks=[0, 1]"}});
}

TEST_CASE("tiny_mode_staged with SELECTIVE recomputation matches NONE under expert parallelism",
          "[mpi][parity][recompute]") {
  check_layouts("tiny_mode_staged", true, Variant{{}, {"train.recompute=SELECTIVE"}});
}

TEST_CASE("tiny_mode_integrated with FULL recomputation matches NONE under expert parallelism",
          "[mpi][parity][recompute]") {
  check_layouts("tiny_mode_integrated", true, Variant{{}, {"train.recompute=FULL"}});
}
