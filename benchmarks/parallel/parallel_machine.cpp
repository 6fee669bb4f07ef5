// parallel_bench's ranks and cores: who prints, how the job fails, the CPUs a rank may use, the
// whole machine for the 1-rank reference, and a broadcast the waiting ranks sleep through.
#if MOD_HAVE_MPI
#include <mpi.h>
#endif
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "benchmarks/parallel/parallel_bench.h"
#include "parallel/world.h"

namespace mod::bench {

using parallel::world;

bool leader() {
  return world().rank() == 0;
}

[[noreturn]] void fail(const std::string& what) {
  world().abort("parallel_bench: " + what, 1);
  std::_Exit(1);  // not reached
}

int online_cpus() {
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return online_cpus();
  return CPU_COUNT(&set);
}

WholeMachine::WholeMachine(int threads) : threads_(omp_get_max_threads()) {
  CPU_ZERO(&saved_);
  saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
  sched_setaffinity(0, sizeof all, &all);  // the kernel keeps the CPUs that exist
  omp_set_num_threads(threads);
}

WholeMachine::~WholeMachine() {
  omp_set_num_threads(threads_);
  if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
}

// Broadcasts rank 0's f64 tensor while the other ranks sleep 20 ms between polls. The
// communicator's waits poll at least every millisecond, and a few ranks doing that on the cores
// of the 2-thread reference slowed it up to 5x (4 ranks on 2 cores): OpenMP's barriers stall
// whenever a woken process preempts one of its threads.
void broadcast_sleeping(Tensor& t) {
#if MOD_HAVE_MPI
  if (world().size() > 1) {
    MPI_Request request;
    if (MPI_Ibcast(t.raw_data(), static_cast<int>(t.numel()), MPI_DOUBLE, 0, MPI_COMM_WORLD,
                   &request) != MPI_SUCCESS)
      fail("MPI_Ibcast of the reference failed");
    for (int done = 0;;) {
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        fail("MPI_Test on the reference's broadcast failed");
      if (done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
#endif
  world().broadcast(t, 0);
}

}  // namespace mod::bench
