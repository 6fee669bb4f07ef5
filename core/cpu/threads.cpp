// OpenMP's thread count and wait policy for this process (see threads.h). Everything that reads
// the machine is separate from the choice itself, which tests feed with fake files and values.
#include "core/cpu/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mod::cpu {

namespace {

// Set beside the wait-policy variables when modtrain set them, so that the re-executed process
// (and any modtrain it starts) can tell its default from the user's choice.
constexpr const char* kDefaultMarker = "MOD_OPENMP_WAIT_DEFAULT";

bool read_words(const std::string& path, std::vector<std::string>& words) {
  std::ifstream f(path);
  if (!f) return false;
  words.clear();
  for (std::string w; f >> w;) words.push_back(w);
  return !words.empty();
}

// Positive number or nothing: "max", "-1" and garbage mean no limit.
double positive(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end != s.c_str() && *end == '\0' && v > 0 ? v : 0;
}

// The folder of `path` (a cgroup path, "/a/b") under `root` and each ancestor up to `root`
// itself. A container that sees only its own cgroup at the mount point has no folder for the
// host's path: then the mount point alone.
std::vector<std::string> cgroup_chain(const std::string& root, std::string path) {
  std::vector<std::string> out;
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (std::ifstream(root + path + "/cgroup.procs") || path.empty() ||
      std::ifstream(root + path + "/cpu.max") || std::ifstream(root + path + "/cpu.cfs_quota_us")) {
    for (;;) {
      out.push_back(root + path);
      if (path.empty()) break;
      path.erase(path.rfind('/'));
    }
  } else {
    out.push_back(root);
  }
  return out;
}

// min over `dirs` of the quota one folder's files state; 0 when none states one.
double smallest_quota(const std::vector<std::string>& dirs, bool v2) {
  double best = 0;
  for (const std::string& dir : dirs) {
    std::vector<std::string> w, p;
    double cpus = 0;
    if (v2 && read_words(dir + "/cpu.max", w) && w.size() == 2) {
      const double quota = positive(w[0]), period = positive(w[1]);
      if (quota > 0 && period > 0) cpus = quota / period;
    } else if (!v2 && read_words(dir + "/cpu.cfs_quota_us", w) &&
               read_words(dir + "/cpu.cfs_period_us", p)) {
      const double quota = positive(w[0]), period = positive(p[0]);
      if (quota > 0 && period > 0) cpus = quota / period;
    }
    if (cpus > 0 && (best == 0 || cpus < best)) best = cpus;
  }
  return best;
}

}  // namespace

double cgroup_cpu_quota(const std::string& proc_cgroup_file, const std::string& mount) {
  std::ifstream f(proc_cgroup_file);
  double best = 0;
  for (std::string line; std::getline(f, line);) {
    // "ID:CONTROLLERS:PATH"; v2's single hierarchy is "0::PATH".
    const auto a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    double q = 0;
    if (controllers.empty()) {
      q = smallest_quota(cgroup_chain(mount, path), /*v2=*/true);
    } else {
      bool cpu = false;
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');) cpu = cpu || c == "cpu";
      if (!cpu) continue;
      for (const std::string& dir : {mount + "/" + controllers, mount + "/cpu"}) {
        if (access(dir.c_str(), F_OK) != 0) continue;
        q = smallest_quota(cgroup_chain(dir, path), /*v2=*/false);
        break;
      }
    }
    if (q > 0 && (best == 0 || q < best)) best = q;
  }
  return best;
}

CpuBudget cpu_budget_of_process(int local_ranks) {
  CpuBudget b;
  b.online = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  b.affinity = b.online;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) b.affinity = std::max(1, CPU_COUNT(&set));
  b.quota = cgroup_cpu_quota();
  b.local_ranks = std::max(1, local_ranks);
  return b;
}

int cpu_share(const CpuBudget& b) {
  const int ranks = std::max(1, b.local_ranks);
  // Unbound ranks on one host share its cores; bound ones already see their own share.
  int share = b.affinity < b.online ? b.affinity : b.affinity / ranks;
  if (b.quota > 0) share = std::min(share, static_cast<int>(std::floor(b.quota / ranks + 1e-9)));
  return std::max(1, share);
}

ThreadChoice choose_threads(const CpuBudget& b, const char* omp_num_threads_env) {
  ThreadChoice c;
  if (omp_num_threads_env && *omp_num_threads_env) {
    c.from_user = true;
    c.threads = std::max(1, std::atoi(omp_num_threads_env));
    c.why = std::string("OMP_NUM_THREADS=") + omp_num_threads_env + ", set by you";
    return c;
  }
  c.threads = cpu_share(b);
  char quota[64] = "no cgroup CPU quota";
  if (b.quota > 0) std::snprintf(quota, sizeof quota, "cgroup CPU quota %.2f CPUs", b.quota);
  char why[256];
  std::snprintf(why, sizeof why, "%d of %d CPUs in the affinity mask, %s, %d rank%s on this host",
                b.affinity, b.online, quota, b.local_ranks, b.local_ranks == 1 ? "" : "s");
  c.why = why;
  return c;
}

std::vector<std::pair<std::string, std::string>> openmp_wait_defaults(const char* wait_policy,
                                                                       const char* spincount) {
  if ((wait_policy && *wait_policy) || (spincount && *spincount)) return {};
  return {{"OMP_WAIT_POLICY", "PASSIVE"}, {kDefaultMarker, "1"}};
}

void reexec_with_openmp_defaults(char** argv) {
  const auto set = openmp_wait_defaults(std::getenv("OMP_WAIT_POLICY"), std::getenv("GOMP_SPINCOUNT"));
  if (set.empty()) return;
  for (const auto& [name, value] : set) setenv(name.c_str(), value.c_str(), 1);
  // The binary's own path, not /proc/self/exe: the kernel names a process after the file it
  // executes, and ps, pkill and job tools must keep seeing "modtrain", not "exe".
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    execv(self, argv);
  }
  // Failed (no /proc?): run on with OpenMP's own default, and say so at the start.
  unsetenv("OMP_WAIT_POLICY");
  setenv(kDefaultMarker, "exec failed", 1);
}

std::string configure_openmp_threads(int local_ranks) {
  const ThreadChoice c = choose_threads(cpu_budget_of_process(local_ranks), std::getenv("OMP_NUM_THREADS"));
  if (!c.from_user) omp_set_num_threads(c.threads);
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* marker = std::getenv(kDefaultMarker);
  std::string wait;
  if (marker && !std::strcmp(marker, "exec failed")) {
    wait = "waiting threads spin first (OpenMP's default: re-executing with OMP_WAIT_POLICY=PASSIVE failed)";
  } else if (marker && policy && !std::strcmp(policy, "PASSIVE") && !spin) {
    wait = "waiting threads sleep (OMP_WAIT_POLICY=PASSIVE, modtrain's default; set OMP_WAIT_POLICY or "
           "GOMP_SPINCOUNT to choose)";
  } else if (!policy && !spin) {
    wait = "waiting threads spin first (OpenMP's default)";
  } else {
    wait = std::string("waiting as you set it (") +
           (policy ? std::string("OMP_WAIT_POLICY=") + policy : std::string()) +
           (policy && spin ? ", " : "") + (spin ? std::string("GOMP_SPINCOUNT=") + spin : std::string()) +
           ")";
  }
  return "threads: " + std::to_string(c.threads) + " OpenMP thread" + (c.threads == 1 ? "" : "s") +
         " (" + c.why + "); " + wait;
}

}  // namespace mod::cpu
