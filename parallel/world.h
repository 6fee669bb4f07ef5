// The job's process layout and its world communicator. A process started by mpirun (OMPI_*
// variables) or srun with PMI (PMIX_* / PMI_*) in an MPI build joins MPI; one of several started
// without MPI (torchrun-style RANK/WORLD_SIZE, srun --mpi=none) meets the others through the
// rendezvous (rendezvous.h; its world carries control traffic and NCCL's bootstrap, not CPU
// training); otherwise it is a world of one with the local communicator.
#pragma once

#include <exception>
#include <string>

#include "parallel/communicator.h"

namespace mod::parallel {

// What the launcher's environment says about this process, before MPI starts.
struct LaunchInfo {
  int rank = 0, local_rank = 0, size = 1;
  int local_size = 1;  // processes on this host (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM_NTASKS_PER_NODE)
  // "Open MPI", "torchrun" (RANK/WORLD_SIZE), "Slurm", "PMIx" or "single process"
  std::string source = "single process";
};
// Reads OMPI_COMM_WORLD_{RANK,LOCAL_RANK,SIZE}, then torchrun's RANK, LOCAL_RANK, WORLD_SIZE
// (and LOCAL_WORLD_SIZE), then SLURM_{PROCID,LOCALID,NTASKS} (only inside a job step, i.e.
// started by srun: a batch script's own shell has SLURM_JOB_ID but no SLURM_STEP_ID and is one
// process), then PMIX_RANK; environment errors (a rank beyond the size, non-numbers, RANK
// without WORLD_SIZE) name the variable.
LaunchInfo launch_info_from_env();

// Starts MPI when the bootstrap (rendezvous_env.h: "auto", "mpi", "tcp" or "file:DIR") resolves
// to MPI (idempotent); for tcp or file it checks the variables now and meets the other ranks at
// the first call of world(). Aborts with a clear message when MPI is asked for and the build
// has none.
void init_world(int* argc, char*** argv, const std::string& bootstrap = "auto");
// The world communicator (init_world first; a world of one if it was never called).
Communicator& world();
const LaunchInfo& launch_info();
// True once this process has joined a world of several processes (MPI, or met the others).
bool world_joined();
// Throws when this process is one of several started without MPI: `what` (e.g.
// "train.device=CPU") needs CPU tensors between ranks, which only the MPI communicator carries.
// Call before world(), so the job fails before waiting for its peers.
void require_mpi_world(const std::string& what);
// Finalises MPI if it was started (call once at exit of main).
void finalize_world();

// For main's catch blocks: prints "modtrain: rank R: <what>" and ends every rank of the job
// (MPI_Abort), so peers waiting in a collective do not hang. In a world of one it exits.
// init_world also installs a std::terminate handler that does this for uncaught exceptions.
[[noreturn]] void abort_on_exception(const std::exception& e, int code = 1);

}  // namespace mod::parallel
