// Catch2 entry point for tests run under mpirun (and as a world of one without it): joins the
// world, runs the session on every rank, then finalises.
// Invariant: a rank with a failed test ends the whole job (MPI_Abort) instead of finalising, so
// peers still inside a collective with it are killed rather than left to hang.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <string>

#include "parallel/world.h"
#include "tests/support/hang_watchdog.h"

int main(int argc, char** argv) {
  mod::parallel::init_world(&argc, &argv);
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) {
    mod::parallel::finalize_world();  // the same bad command line on every rank
    return rc;
  }
  const int failed = session.run();
  if (failed != 0 && mod::parallel::world().size() > 1)
    mod::parallel::world().abort(std::to_string(failed) + " test case(s) failed on this rank", 1);
  mod::parallel::finalize_world();
  return failed;
}
