// The job's process layout and its world communicator. A process started by mpirun (OMPI_*
// variables) or srun (SLURM_* / PMIX_* variables) in an MPI build joins MPI; otherwise it is a
// world of one with the local communicator.
#pragma once

#include <exception>
#include <string>

#include "parallel/communicator.h"

namespace mod::parallel {

// What the launcher's environment says about this process, before MPI starts.
struct LaunchInfo {
  int rank = 0, local_rank = 0, size = 1;
  int local_size = 1;  // processes on this host (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE)
  std::string source = "single process";  // "Open MPI", "Slurm", "PMIx" or "single process"
};
// Reads OMPI_COMM_WORLD_{RANK,LOCAL_RANK,SIZE}, then SLURM_{PROCID,LOCALID,NTASKS} (only inside
// a job step, i.e. started by srun: a batch script's own shell has SLURM_JOB_ID but no
// SLURM_STEP_ID and is one process), then PMIX_RANK; environment errors (a rank beyond the
// size, non-numbers) name the variable.
LaunchInfo launch_info_from_env();

// Starts MPI when the launch info asks for more than one process (idempotent). Aborts with a
// clear message when the build has no MPI and the launcher started several processes.
void init_world(int* argc, char*** argv);
// The world communicator (init_world first; a world of one if it was never called).
Communicator& world();
const LaunchInfo& launch_info();
// Finalises MPI if it was started (call once at exit of main).
void finalize_world();

// For main's catch blocks: prints "modtrain: rank R: <what>" and ends every rank of the job
// (MPI_Abort), so peers waiting in a collective do not hang. In a world of one it exits.
// init_world also installs a std::terminate handler that does this for uncaught exceptions.
[[noreturn]] void abort_on_exception(const std::exception& e, int code = 1);

}  // namespace mod::parallel
