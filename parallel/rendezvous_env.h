// Which way the ranks of a job meet, and where rank 0 is, from the command line and the
// launcher's variables (docs/parallel.md, "Starting without MPI", has the table). Invariant: a
// variable that is set but unusable is an error naming it, never a silent default.
#pragma once

#include <string>

#include "parallel/rendezvous.h"

namespace mod::parallel {

struct LaunchInfo;

struct Bootstrap {
  enum Method { Auto, Single, Mpi, Tcp, File };
  Method method = Auto;
  std::string dir;  // File: the shared directory
};
// "auto", "mpi", "tcp" or "file:DIR" (modtrain train --rendezvous); errors name the choices.
Bootstrap parse_bootstrap(const std::string& text);
// Auto made concrete: MPI when an MPI launcher started us (OMPI_COMM_WORLD_RANK, PMIX_RANK or
// PMI_RANK set), else tcp when the launch has several ranks (torchrun or srun --mpi=none), else
// a single process. An explicit choice is kept.
Bootstrap resolve_bootstrap(const Bootstrap& choice, const LaunchInfo& info);
// "tcp", "file:/shared/rdzv", "mpi", "single process".
std::string describe(const Bootstrap& b);

// The first host of a Slurm node list in its compressed form: "node[01-04,07],gpu5" -> "node01".
// Throws on a malformed list, quoting it.
std::string first_host_of_nodelist(const std::string& nodelist);

// The rendezvous of this process for a Tcp or File bootstrap: rank and size from `info`;
// MASTER_ADDR, or the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST; MASTER_PORT, or
// under Slurm 20000 + SLURM_JOB_ID % 20000, else 29500; the job token from
// MOD_RENDEZVOUS_TOKEN, Slurm's job, step and restart count, or TORCHELASTIC_RUN_ID (the file
// method needs one); MOD_RENDEZVOUS_TIMEOUT_S (default 300) to meet; collective_timeout() after.
RendezvousOptions rendezvous_options_from_env(const Bootstrap& bootstrap, const LaunchInfo& info);

}  // namespace mod::parallel
