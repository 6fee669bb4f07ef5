// The OpenMP threads a process runs with: how many and how they wait. The count is the process's
// CPUs (its affinity mask and its cgroup's CPU quota, shared among the host's ranks) unless
// OMP_NUM_THREADS is set; waiting threads sleep (OMP_WAIT_POLICY=PASSIVE) unless OMP_WAIT_POLICY
// or GOMP_SPINCOUNT is set, because a spinning thread burns a core another process needs
// (docs/performance.md, "Threads on a shared machine"). The user's variables always win.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace mod::cpu {

// CPUs the cgroup CPU quota grants (what containers and Slurm's cgroup limits set): the smallest
// quota / period of the process's cgroup and its ancestors, cgroup v2 (`cpu.max`, "QUOTA PERIOD"
// or "max PERIOD") or v1 (`cpu.cfs_quota_us`, -1 for none, and `cpu.cfs_period_us`). 0 when no
// quota applies or none can be read. `proc_cgroup` is /proc/self/cgroup's text; `mount` is where
// the hierarchy is mounted (v1: the folder holding cpu/ or cpu,cpuacct/). Parameters so tests can
// point it at fake files.
double cgroup_cpu_quota(const std::string& proc_cgroup_file = "/proc/self/cgroup",
                        const std::string& mount = "/sys/fs/cgroup");

// What bounds one process's threads.
struct CpuBudget {
  int affinity = 1;     // CPUs in the process's affinity mask
  int online = 1;       // CPUs online on the host
  double quota = 0;     // CPUs the cgroup quota grants (cgroup_cpu_quota), 0: none
  int local_ranks = 1;  // processes of the job on this host (parallel/world.h local_size)
};
CpuBudget cpu_budget_of_process(int local_ranks);

// This process's share of CPUs, at least 1: a mask smaller than the host is the rank's own (a
// bound rank); an unbound rank gets the host's CPUs / local ranks; a quota is shared by the
// ranks of its cgroup (one container or job), so each gets floor(quota / local ranks).
int cpu_share(const CpuBudget& b);

struct ThreadChoice {
  int threads = 1;
  bool from_user = false;  // OMP_NUM_THREADS was set: OpenMP's own count is left alone
  std::string why;         // e.g. "2 CPUs in the affinity mask, no cgroup CPU quota, 1 rank on this host"
};
// The thread count: OMP_NUM_THREADS (`omp_num_threads_env`, null when unset) wins; otherwise
// cpu_share(b).
ThreadChoice choose_threads(const CpuBudget& b, const char* omp_num_threads_env);

// The environment assignments modtrain's OpenMP default needs, given the user's
// OMP_WAIT_POLICY and GOMP_SPINCOUNT (null when unset): none when either is set.
std::vector<std::pair<std::string, std::string>> openmp_wait_defaults(const char* wait_policy,
                                                                       const char* spincount);

// Call first in main, before anything starts OpenMP: when openmp_wait_defaults asks for
// variables, sets them and re-executes the program (/proc/self/exe, same arguments), because
// libgomp reads its environment once, when it is loaded, before main runs. Returns only when
// nothing was needed or the re-execution failed (then OpenMP keeps its spinning default and
// describe_openmp_threads says so).
void reexec_with_openmp_defaults(char** argv);

// Sets the thread count (omp_set_num_threads, unless the user's OMP_NUM_THREADS stands) and
// returns one line for the run's start, e.g. "threads: 2 OpenMP threads (2 CPUs in the affinity
// mask, ...); waiting threads sleep (OMP_WAIT_POLICY=PASSIVE, modtrain's default: ...)".
std::string configure_openmp_threads(int local_ranks);

}  // namespace mod::cpu
