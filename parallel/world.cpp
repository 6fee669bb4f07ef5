// The job's layout from the launcher's environment, and the world communicator built from it.
// Invariant: once MPI is started, every way out of a rank other than finalize_world (an uncaught
// exception, abort_on_exception, a timed-out collective) ends the whole job, so no rank is left
// waiting for a peer that has gone.
#include "parallel/world.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <utility>

#include "parallel/rendezvous_communicator.h"
#include "parallel/rendezvous_env.h"

#if MOD_HAVE_MPI
#include "parallel/mpi_communicator.h"
#include "parallel/mpi_peer_watch.h"
#endif

namespace mod::parallel {

namespace {

struct WorldState {
  bool info_read = false;
  LaunchInfo info;
  std::unique_ptr<Communicator> world;
  bool initialised = false;  // init_world ran
  bool finalised = false;    // finalize_world ran after it
  bool mpi_started = false;  // we called MPI_Init_thread, so we finalise
  Bootstrap bootstrap;       // resolved by init_world
  std::optional<RendezvousOptions> to_meet;  // tcp/file: met at the first world()
  std::terminate_handler previous_terminate = nullptr;
};

WorldState& state() {
  static WorldState s;
  return s;
}

// A non-negative decimal int, the whole string; errors name the variable.
int parse_env_int(const char* var, const char* text) {
  const std::string s(text);
  int value = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || value < 0)
    throw std::runtime_error("environment: " + std::string(var) + "='" + s +
                             "' is not a non-negative integer");
  return value;
}

const char* require_env(const char* var, const char* because) {
  const char* text = std::getenv(var);
  if (text == nullptr)
    throw std::runtime_error("environment: " + std::string(because) + " is set but " + var +
                             " is not");
  return text;
}

// rank/local_rank/size from three variables of one launcher, checked against each other.
LaunchInfo read_triple(const char* rank_var, const char* local_var, const char* size_var,
                       const char* source) {
  LaunchInfo info;
  info.source = source;
  info.rank = parse_env_int(rank_var, std::getenv(rank_var));
  info.local_rank = parse_env_int(local_var, require_env(local_var, rank_var));
  info.size = parse_env_int(size_var, require_env(size_var, rank_var));
  if (info.size < 1)
    throw std::runtime_error("environment: " + std::string(size_var) + "=" +
                             std::to_string(info.size) + " must be at least 1");
  if (info.rank >= info.size || info.local_rank >= info.size)
    throw std::runtime_error("environment: " + std::string(rank_var) + "=" +
                             std::to_string(info.rank) + " and " + local_var + "=" +
                             std::to_string(info.local_rank) + " must be below " + size_var + "=" +
                             std::to_string(info.size));
  return info;
}

[[noreturn]] void abort_on_terminate() {
  std::string what = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("uncaught exception: ") + x.what();
    } catch (...) {
      what = "uncaught exception of a non-standard type";
    }
  }
  world().abort(what, 1);
  std::_Exit(1);  // not reached: abort() ends the process (GCC cannot see through the virtual)
}

}  // namespace

// Processes on this host, where the launcher says (1 where it does not).
int local_size_from(const char* var) {
  const char* text = std::getenv(var);
  return text ? std::max(1, parse_env_int(var, text)) : 1;
}

LaunchInfo launch_info_from_env() {
  if (std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    LaunchInfo info = read_triple("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "OMPI_COMM_WORLD_SIZE", "Open MPI");
    info.local_size = local_size_from("OMPI_COMM_WORLD_LOCAL_SIZE");
    return info;
  }
  // torchrun sets these for its workers; under srun, SLURM_PROCID is the agent's rank, not theirs.
  if (std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr) {
    if (std::getenv("RANK") == nullptr)
      throw std::runtime_error("environment: WORLD_SIZE is set but RANK is not");
    LaunchInfo info = read_triple("RANK", "LOCAL_RANK", "WORLD_SIZE", "torchrun");
    info.local_size = local_size_from("LOCAL_WORLD_SIZE");
    return info;
  }
  // A batch script's own process has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no
  // step: only srun's tasks form a world, so a process started there directly is one process.
  const bool slurm_batch_process =
      std::getenv("SLURM_JOB_ID") != nullptr && std::getenv("SLURM_STEP_ID") == nullptr;
  if (std::getenv("SLURM_PROCID") != nullptr && !slurm_batch_process) {
    LaunchInfo info = read_triple("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "Slurm");
    info.local_size = local_size_from("SLURM_NTASKS_PER_NODE");
    return info;
  }
  if (const char* pmix = std::getenv("PMIX_RANK")) {
    LaunchInfo info;
    info.source = "PMIx";
    info.rank = parse_env_int("PMIX_RANK", pmix);
    info.size = info.rank + 1;  // a lower bound; init_world takes the size from MPI
    return info;
  }
  return LaunchInfo{};
}

namespace {

LaunchInfo& cached_launch_info() {
  WorldState& s = state();
  if (!s.info_read) {
    s.info = launch_info_from_env();
    s.info_read = true;
  }
  return s.info;
}

}  // namespace

const LaunchInfo& launch_info() {
  return cached_launch_info();
}

void init_world(int* argc, char*** argv, const std::string& bootstrap) {
  WorldState& s = state();
  if (s.initialised) return;
  if (s.finalised) throw std::logic_error("init_world after finalize_world: MPI cannot restart");
  LaunchInfo& info = cached_launch_info();
  collective_timeout();  // a bad MOD_COLLECTIVE_TIMEOUT_S throws here, before MPI starts
  s.bootstrap = resolve_bootstrap(parse_bootstrap(bootstrap), info);
  if (s.bootstrap.method == Bootstrap::Tcp || s.bootstrap.method == Bootstrap::File) {
    s.to_meet = rendezvous_options_from_env(s.bootstrap, info);  // bad variables throw now
    s.initialised = true;
    return;
  }
  const bool launched = s.bootstrap.method == Bootstrap::Mpi;
#if MOD_HAVE_MPI
  if (launched) {
    int already = 0;
    MPI_Initialized(&already);
    if (!already) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);  // errors here are fatal
      s.mpi_started = true;
      if (provided < MPI_THREAD_FUNNELED) {
        std::fprintf(stderr,
                     "modtrain: rank %d: MPI provides thread level %d, below "
                     "MPI_THREAD_FUNNELED\n",
                     info.rank, provided);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    }
    MPI_Comm dup = MPI_COMM_NULL;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS) {
      std::fprintf(stderr, "modtrain: rank %d: MPI_Comm_dup(MPI_COMM_WORLD) failed\n", info.rank);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    auto world = std::make_unique<MpiCommunicator>(dup, "world");
    start_peer_watch(*world);  // before any split: groups name their peers' hosts
    s.world = std::move(world);
    if (info.source == "PMIx") info.size = s.world->size();
    if (s.world->rank() != info.rank || s.world->size() != info.size)
      s.world->abort("MPI says rank " + std::to_string(s.world->rank()) + " of " +
                         std::to_string(s.world->size()) + " but the " + info.source +
                         " environment says rank " + std::to_string(info.rank) + " of " +
                         std::to_string(info.size),
                     2);
    s.previous_terminate = std::set_terminate(abort_on_terminate);
  }
#else
  (void)argc;
  (void)argv;
  if (launched && (info.size > 1 || info.source == "PMIx")) {
    std::fprintf(stderr,
                 "modtrain: rank %d: started as rank %d of %d by %s, but this build has no MPI; "
                 "rebuild with -DMOD_USE_MPI=ON, or start the ranks without MPI (torchrun-style "
                 "RANK/WORLD_SIZE or srun --mpi=none, --rendezvous tcp)\n",
                 info.rank, info.rank, info.size, info.source.c_str());
    std::fflush(stderr);
    std::exit(2);
  }
#endif
  if (!s.world) s.world = make_local_communicator("world");
  s.initialised = true;
}

Communicator& world() {
  WorldState& s = state();
  if (s.to_meet) {  // tcp or file: meet once; a failed meeting leaves a world of one
    const RendezvousOptions options = *std::exchange(s.to_meet, std::nullopt);
    s.world = make_local_communicator("world");
    s.world = make_rendezvous_communicator(Rendezvous::meet(options), "world");
    if (s.world->size() > 1) s.previous_terminate = std::set_terminate(abort_on_terminate);
  }
  if (!s.world) s.world = make_local_communicator("world");
  return *s.world;
}

bool world_joined() {
  const WorldState& s = state();
  return s.world && s.world->size() > 1;
}

void require_mpi_world(const std::string& what) {
  const WorldState& s = state();
  const LaunchInfo& info = launch_info();
  if (s.bootstrap.method != Bootstrap::Tcp && s.bootstrap.method != Bootstrap::File) return;
  if (info.size <= 1) return;
  throw std::invalid_argument(
      what + " with " + std::to_string(info.size) + " processes needs MPI: CPU tensors between "
      "ranks travel only over the MPI communicator, and these processes (started by " +
      info.source + ", --rendezvous " + describe(s.bootstrap) +
      ") have none. Start them with mpirun or srun --mpi=pmix, or train with train.device=CUDA "
      "(the rendezvous then bootstraps NCCL)");
}

void finalize_world() {
  WorldState& s = state();
  s.world.reset();
  if (s.previous_terminate != nullptr) {
    std::set_terminate(s.previous_terminate);
    s.previous_terminate = nullptr;
  }
#if MOD_HAVE_MPI
  int finalized = 0;
  MPI_Finalized(&finalized);
  stop_peer_watch();
  if (s.mpi_started && !finalized) MPI_Finalize();
#endif
  s.mpi_started = false;
  s.to_meet.reset();
  s.finalised = s.initialised;
  s.initialised = false;
}

void abort_on_exception(const std::exception& e, int code) {
  world().abort(e.what(), code);
  std::_Exit(code);  // not reached, as above
}

}  // namespace mod::parallel
