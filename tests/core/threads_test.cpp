// OpenMP's thread count and wait policy (core/cpu/threads.h): the cgroup quota read from fake
// cgroup files (v1 and v2, nested limits), the share among a host's ranks, and the user's
// variables winning over modtrain's defaults.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/cpu/threads.h"

using namespace mod;
namespace fs = std::filesystem;

namespace {
// A fresh folder for one test's fake /proc/self/cgroup and cgroup mount.
struct FakeCgroups {
  fs::path root;
  FakeCgroups() {
    root = fs::temp_directory_path() / ("mod_threads_test_" + std::to_string(getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "mnt");
  }
  ~FakeCgroups() { fs::remove_all(root); }
  void write(const std::string& rel, const std::string& text) const {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  }
  double quota() const {
    return cpu::cgroup_cpu_quota((root / "self_cgroup").string(), (root / "mnt").string());
  }
};
}  // namespace

TEST_CASE("cgroup v2 cpu.max gives the quota in CPUs", "[threads]") {
  FakeCgroups f;
  f.write("self_cgroup", "0::/job/step\n");
  f.write("mnt/job/step/cgroup.procs", "1\n");
  SECTION("quota and period") {
    f.write("mnt/job/step/cpu.max", "150000 100000\n");
    CHECK(f.quota() == Approx(1.5));
  }
  SECTION("max: no quota") {
    f.write("mnt/job/step/cpu.max", "max 100000\n");
    CHECK(f.quota() == 0);
  }
  SECTION("the smallest limit of the cgroup and its ancestors") {
    f.write("mnt/job/step/cpu.max", "max 100000\n");
    f.write("mnt/job/cpu.max", "400000 100000\n");
    f.write("mnt/cpu.max", "800000 100000\n");
    CHECK(f.quota() == Approx(4.0));
  }
  SECTION("a container sees only its own cgroup at the mount point") {
    f.write("self_cgroup", "0::/docker/abc123\n");
    f.write("mnt/cpu.max", "200000 100000\n");
    CHECK(f.quota() == Approx(2.0));
  }
  SECTION("garbage is no quota") {
    f.write("mnt/job/step/cpu.max", "lots\n");
    CHECK(f.quota() == 0);
  }
}

TEST_CASE("cgroup v1 cfs_quota_us / cfs_period_us give the quota in CPUs", "[threads]") {
  FakeCgroups f;
  f.write("self_cgroup", "5:memory:/slurm/job_7\n4:cpu,cpuacct:/slurm/job_7\n1:name=systemd:/\n");
  f.write("mnt/cpu,cpuacct/slurm/job_7/cgroup.procs", "1\n");
  SECTION("a quota") {
    f.write("mnt/cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us", "300000\n");
    f.write("mnt/cpu,cpuacct/slurm/job_7/cpu.cfs_period_us", "100000\n");
    CHECK(f.quota() == Approx(3.0));
  }
  SECTION("-1: none") {
    f.write("mnt/cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us", "-1\n");
    f.write("mnt/cpu,cpuacct/slurm/job_7/cpu.cfs_period_us", "100000\n");
    CHECK(f.quota() == 0);
  }
  SECTION("no cgroup files at all") {
    CHECK(f.quota() == 0);
  }
}

TEST_CASE("the CPUs of a host are shared among its ranks", "[threads]") {
  cpu::CpuBudget b;
  b.online = 8, b.affinity = 8, b.local_ranks = 1;
  CHECK(cpu::cpu_share(b) == 8);
  b.local_ranks = 4;  // unbound: each gets a quarter
  CHECK(cpu::cpu_share(b) == 2);
  b.affinity = 3;  // bound: the mask is the rank's own
  CHECK(cpu::cpu_share(b) == 3);
  b.affinity = 8, b.local_ranks = 2, b.quota = 3.0;  // a container's quota, shared: floor(1.5)
  CHECK(cpu::cpu_share(b) == 1);
  b.local_ranks = 1, b.quota = 2.5;
  CHECK(cpu::cpu_share(b) == 2);
  b.quota = 0.5;  // never below one thread
  CHECK(cpu::cpu_share(b) == 1);
  b.quota = 0, b.local_ranks = 16;
  CHECK(cpu::cpu_share(b) == 1);
}

TEST_CASE("OMP_NUM_THREADS set by the user wins over the CPUs", "[threads]") {
  cpu::CpuBudget b;
  b.online = 2, b.affinity = 2, b.quota = 1.0;
  const cpu::ThreadChoice mine = cpu::choose_threads(b, nullptr);
  CHECK_FALSE(mine.from_user);
  CHECK(mine.threads == 1);
  CHECK_THAT(mine.why, Catch::Contains("quota 1.00"));
  const cpu::ThreadChoice empty = cpu::choose_threads(b, "");
  CHECK_FALSE(empty.from_user);
  const cpu::ThreadChoice theirs = cpu::choose_threads(b, "4");
  CHECK(theirs.from_user);
  CHECK(theirs.threads == 4);
  CHECK_THAT(theirs.why, Catch::Contains("OMP_NUM_THREADS=4"));
}

TEST_CASE("the user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins over the passive default", "[threads]") {
  const auto none = cpu::openmp_wait_defaults(nullptr, nullptr);
  REQUIRE(none.size() >= 1);
  CHECK(none.front() == std::pair<std::string, std::string>{"OMP_WAIT_POLICY", "PASSIVE"});
  CHECK(cpu::openmp_wait_defaults("ACTIVE", nullptr).empty());
  CHECK(cpu::openmp_wait_defaults(nullptr, "10000").empty());
  CHECK(cpu::openmp_wait_defaults("", "").size() == none.size());
}
