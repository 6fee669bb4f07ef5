// tiny_dense and tiny_mod (with its predictor) under every dp x tp (x ZeRO-1) layout the world
// size allows, against one process (see parity_harness.h).
#include "tests/support/parity_harness.h"

using mod::test::parity::check_layouts;

TEST_CASE("tiny_dense: every layout matches one process for 20 steps", "[mpi][parity]") {
  check_layouts("tiny_dense");
}

TEST_CASE("tiny_mod: every layout matches one process for 20 steps", "[mpi][parity]") {
  check_layouts("tiny_mod");
}
