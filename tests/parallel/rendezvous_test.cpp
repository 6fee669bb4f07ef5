// The rendezvous without MPI (parallel/rendezvous.h): 2 and 4 ranks meeting over TCP and
// through a file, each rank a thread with its own Rendezvous over loopback; its collectives and
// split, the communicator on top, bad meetings (duplicate rank, another world size or job) and
// ranks that never come, each an error within a short timeout; and the launch variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, the Slurm node list); strangers on rank 0's port
// (silent, garbage, another job's hello, a 2 GiB header, 50 idle connections) that must neither
// delay the meeting nor cost rank 0 memory. All traffic is on 127.0.0.1.
#include "parallel/rendezvous.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "parallel/rendezvous_communicator.h"
#include "parallel/rendezvous_env.h"
#include "parallel/rendezvous_wire.h"
#include "parallel/tcp_socket.h"
#include "parallel/world.h"
#include "tests/support/env_guard.h"

namespace mod::parallel {
namespace {

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

constexpr double kTimeout = 2;  // seconds, to meet and for each collective

int free_port() {
  return tcp::listen_on("127.0.0.1", 0, 1).local_port();
}

RendezvousOptions options(int rank, int size, int port, const std::string& token = "job-1") {
  RendezvousOptions o;
  o.rank = rank;
  o.size = size;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.token = token;
  o.host = "host" + std::to_string(rank);
  o.timeout_s = kTimeout;
  o.op_timeout_s = kTimeout;
  o.found_by = "the test";
  return o;
}

// Runs body(rank) on `size` threads; returns each rank's error message ("" when none).
std::vector<std::string> on_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

double seconds_of(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("modtrain_rdzv_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// What every rank must see after meeting: hosts, gathers in rank order, broadcasts from any
// root, a dp x tp split, and the communicator's collectives bitwise equal on every rank.
void exercise(Rendezvous& r, int size) {
  CHECK(r.hosts().size() == static_cast<size_t>(size));
  CHECK(r.hosts()[size - 1] == "host" + std::to_string(size - 1));
  const auto all = r.all_gather("blob" + std::to_string(r.rank()));
  for (int i = 0; i < size; ++i) CHECK(all[i] == "blob" + std::to_string(i));
  CHECK(r.broadcast(r.rank() == size - 1 ? "from the last" : "ignored", size - 1) ==
        "from the last");
  r.barrier();
  auto tp = r.split(r.rank() / 2, r.rank());  // tp fastest: {0,1}, {2,3}
  CHECK(tp->size() == std::min(2, size));
  CHECK(tp->rank() == r.rank() % 2);
  const auto pair = tp->all_gather(std::to_string(r.rank()));
  CHECK(pair[0] == std::to_string(r.rank() / 2 * 2));
  auto reversed = r.split(0, -r.rank());  // key order, not rank order
  CHECK(reversed->rank() == size - 1 - r.rank());
}

}  // namespace

TEST_CASE("ranks meet over TCP and through a file, at 2 and 4 ranks") {
  for (const int size : {2, 4}) {
    for (const bool file : {false, true}) {
      CAPTURE(size, file);
      const int port = free_port();
      const fs::path dir = temp_dir("meet");
      const auto errors = on_ranks(size, [&](int rank) {
        RendezvousOptions o = options(rank, size, port);
        o.timeout_s = 20;  // the meeting succeeds; a loaded machine may start a rank late
        if (file) o.file_dir = dir.string();
        auto r = Rendezvous::meet(o);
        exercise(*r, size);
      });
      for (const auto& e : errors) CHECK(e == "");
      CHECK(fs::is_empty(dir));  // rank 0 removes its published file once everyone met
    }
  }
}

TEST_CASE("a stale file from an earlier job is not taken for this job's") {
  const fs::path dir = temp_dir("stale");
  const int dead_port = free_port();  // nothing listens there any more
  const std::string path = (dir / "modtrain-rendezvous-job-1").string();
  std::ofstream(path) << "modtrain-rendezvous 1 job-1 0123abcd 127.0.0.1 " << dead_port << "\n";
  const auto errors = on_ranks(3, [&](int rank) {
    if (rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    RendezvousOptions o = options(rank, 3, 0);
    o.file_dir = dir.string();
    o.master_addr.clear();
    o.host = "127.0.0.1";  // what rank 0 publishes without MASTER_ADDR
    o.timeout_s = 20;  // the meeting succeeds; a loaded machine may start rank 0 seconds late
    CHECK(Rendezvous::meet(o)->all_gather("x").size() == 3);
  });
  for (const auto& e : errors) CHECK(e == "");
}

TEST_CASE("a bad meeting is an error on every rank that reached rank 0") {
  SECTION("two processes claim the same rank") {
    const int port = free_port();
    const auto errors = on_ranks(3, [&](int rank) {
      Rendezvous::meet(options(rank == 2 ? 1 : rank, 3, port));
    });
    for (const auto& e : errors) CHECK_THAT(e, Contains("claims a rank that") && Contains("already has"));
  }
  SECTION("another world size") {
    const int port = free_port();
    const auto errors = on_ranks(2, [&](int rank) {
      Rendezvous::meet(options(rank, 2, port)).reset();
    });
    CHECK(errors[0] == "");
    const auto wrong = on_ranks(2, [&](int rank) {
      RendezvousOptions o = options(rank, 2, port);
      if (rank == 1) o.size = 3;
      Rendezvous::meet(o);
    });
    for (const auto& e : wrong)
      CHECK_THAT(e, Contains("says the world has 3 ranks, rank 0 says 2"));
  }
  SECTION("another job's token") {
    const int port = free_port();
    const auto errors = on_ranks(2, [&](int rank) {
      Rendezvous::meet(options(rank, 2, port, rank == 0 ? "job-1" : "job-2"));
    });
    for (const auto& e : errors) CHECK_THAT(e, Contains("belongs to another job") && Contains("job-2"));
  }
}

TEST_CASE("a rank that never comes, or no rank 0, is an error within the timeout") {
  const int port = free_port();
  std::string error;
  const double waited = seconds_of([&] {
    try {
      Rendezvous::meet(options(0, 3, port));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  CHECK_THAT(error, Contains("rank(s) 1, 2 of 3 did not reach rank 0 within 2 s"));
  CHECK((waited >= kTimeout - 0.1 && waited < kTimeout + 1.5));

  error.clear();
  const double waited_for_0 = seconds_of([&] {
    try {
      Rendezvous::meet(options(1, 2, free_port()));  // a port nobody listens on
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  CHECK_THAT(error, Contains("rank 1 cannot meet rank 0") && Contains("127.0.0.1:") &&
                        Contains("Connection refused"));
  CHECK(waited_for_0 < kTimeout + 1.5);

  const fs::path dir = temp_dir("nofile");
  RendezvousOptions o = options(1, 2, 0);
  o.file_dir = dir.string();
  CHECK_THROWS_WITH(Rendezvous::meet(o), Contains("found no " + dir.string() +
                                                  "/modtrain-rendezvous-job-1 from rank 0"));
}

TEST_CASE("a collective one rank never enters, or a rank that leaves, ends it on every rank") {
  const int port = free_port();
  const auto errors = on_ranks(3, [&](int rank) {
    auto r = Rendezvous::meet(options(rank, 3, port));
    r->barrier();
    if (rank == 2) {  // stays in the job but skips the gather
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      return;
    }
    r->all_gather("x");
  });
  CHECK_THAT(errors[0], Contains("rank(s) 2 did not enter it within 2 s"));
  CHECK_THAT(errors[1], Contains("rank(s) 2 did not enter it within 2 s"));

  const int port2 = free_port();
  const auto left = on_ranks(3, [&](int rank) {
    auto r = Rendezvous::meet(options(rank, 3, port2));
    if (rank == 1) return;  // exits: its socket closes
    r->all_gather("x");
  });
  CHECK_THAT(left[0], Contains("rank 1") && Contains("closed the connection"));
  CHECK_THAT(left[2], Contains("rank 1") && Contains("closed the connection"));
}

namespace {

// This process's peak resident memory in KiB (VmHWM), after resetting the peak where the kernel
// allows it (clear_refs 5), so an earlier test's peak does not hide this one's.
long peak_rss_kib(bool reset = false) {
  if (reset) std::ofstream("/proc/self/clear_refs") << "5";
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// What this process writes to stderr (fd 2) from construction to take().
class StderrCapture {
 public:
  StderrCapture()
      : path_(fs::temp_directory_path() / ("modtrain_rdzv_log_" + std::to_string(::getpid()))) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(path_.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string take() {
    restore();
    std::ifstream in(path_);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    fs::remove(path_);
    return text;
  }
  ~StderrCapture() { restore(); }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }
  fs::path path_;
  int saved_ = -1;
};

// A hostile connection to rank 0's port, as rank 0 names it in its log ("127.0.0.1:54321").
struct Stranger {
  tcp::Socket socket;
  std::string address;
  std::string reason;  // what rank 0's log line about it must say
};

Stranger connect_stranger(int port, std::string reason) {
  tcp::Socket s = tcp::connect_until("127.0.0.1", port, tcp::deadline_after(kTimeout), "test");
  const std::string address = s.local_address() + ":" + std::to_string(s.local_port());
  return {std::move(s), address, std::move(reason)};
}

void send_bytes(tcp::Socket& s, const void* data, size_t bytes) {
  s.send_all(data, bytes, tcp::deadline_after(1), "stranger");
}

}  // namespace

// Rank 0 serves every connection at once and bounds a stranger's bytes and time before its hello
// (docs/parallel.md, "The rendezvous's limits"): the ranks still meet at once, each stranger is
// dropped with a log line naming its address, and a header claiming 2 GiB allocates nothing.
TEST_CASE("strangers on rank 0's port neither delay the meeting nor cost rank 0 memory") {
  const int port = free_port();
  std::vector<std::string> errors(2);
  std::vector<std::string> gathered;
  const long rss_before_kib = peak_rss_kib(/*reset=*/true);
  StderrCapture captured;
  std::thread rank0([&] {
    try {
      gathered = Rendezvous::meet(options(0, 2, port))->all_gather("zero");
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
  });
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  } joiner{rank0};
  std::vector<Stranger> strangers;
  auto silent = [&] { strangers.push_back(connect_stranger(port, "no hello")); };
  auto garbage = [&] {
    strangers.push_back(connect_stranger(port, "not a modtrain rendezvous message"));
    const std::string get = "GET / HTTP/1.1\r\nHost: rank0\r\n\r\n";
    send_bytes(strangers.back().socket, get.data(), get.size());
  };
  auto another_job = [&] {
    strangers.push_back(connect_stranger(port, "belongs to another job"));
    const std::string hello =
        wire::Writer().i64(1).i64(2).str("job-2").str("elsewhere").str("").take();
    wire::send_frame(strangers.back().socket, wire::Kind::Hello, 0, hello, tcp::deadline_after(1),
                     "stranger");
    // It is told why, at once, as a rank of that job would need to be.
    const wire::Frame answer =
        wire::recv_frame(strangers.back().socket, tcp::deadline_after(1), "stranger");
    CHECK_THAT(wire::Reader(answer.payload, "rank 0").str(),
               Contains("belongs to another job") && Contains("job-2"));
  };
  auto claims_2_gib = [&] {
    strangers.push_back(connect_stranger(port, "2147483648"));
    const uint64_t header[3] = {(uint64_t{wire::kMagic} << 32) | 1, 0, uint64_t{1} << 31};
    send_bytes(strangers.back().socket, header, sizeof header);
  };
  auto idle_50 = [&] {
    for (int i = 0; i < 50; ++i) strangers.push_back(connect_stranger(port, "no hello"));
  };
  SECTION("a connection that sends nothing") {
    silent();
  }
  SECTION("garbage") {
    garbage();
  }
  SECTION("another job's hello") {
    another_job();
  }
  SECTION("a header claiming 2 GiB") {
    claims_2_gib();
  }
  SECTION("50 idle connections") {
    idle_50();
  }
  SECTION("all of them at once") {
    idle_50();
    silent();
    garbage();
    another_job();
    claims_2_gib();
  }
  // Rank 0 has had time to read (and, unbounded, to allocate) what the strangers sent.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double rank1_met_in_s = seconds_of([&] {
    try {
      CHECK(Rendezvous::meet(options(1, 2, port))->all_gather("one") ==
            std::vector<std::string>{"zero", "one"});
    } catch (const std::exception& e) {
      errors[1] = e.what();
    }
  });
  rank0.join();
  const long rss_growth_mib = (peak_rss_kib() - rss_before_kib) / 1024;
  const std::string log = captured.take();
  std::printf(
      "rendezvous under attack (%zu stranger(s)): rank 1 met in %.3f s, peak RSS +%ld MiB\n",
      strangers.size(), rank1_met_in_s, rss_growth_mib);
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  CHECK(gathered == std::vector<std::string>{"zero", "one"});
  CHECK(rank1_met_in_s < 1.0);  // a meeting takes milliseconds; a stranger's deadline is 2 s
  CHECK(rss_growth_mib < 64);
  INFO("rank 0's log:\n" << log);
  for (const Stranger& s : strangers) {
    CAPTURE(s.address, s.reason);
    bool logged = false;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);)
      logged |= line.find("dropped " + s.address + ":") != std::string::npos &&
                line.find(s.reason) != std::string::npos;
    CHECK(logged);
  }
}

TEST_CASE("the rendezvous communicator reduces bitwise equally on every rank") {
  const int port = free_port();
  std::vector<std::vector<float>> results(4);
  const auto errors = on_ranks(4, [&](int rank) {
    auto comm = make_rendezvous_communicator(Rendezvous::meet(options(rank, 4, port)));
    Tensor t = Tensor::from_vector({0.1f * (rank + 1), 1e8f, -1e8f * (rank == 3)}, {3});
    comm->all_reduce(t);
    results[rank] = {t.data<float>(), t.data<float>() + 3};
    Tensor mine = Tensor::from_vector({static_cast<float>(rank)}, {1});
    Tensor all = Tensor::empty({4}, DType::F32);
    comm->all_gather(mine, all);
    for (int r = 0; r < 4; ++r) CHECK(all.data<float>()[r] == r);
    Tensor flag = Tensor::from_vector({static_cast<double>(rank == 2)}, {1}, DType::F64);
    comm->all_reduce(flag, ReduceOp::Max);
    CHECK(flag.data<double>()[0] == 1);
    Tensor big = Tensor::empty({2}, DType::F32);
    CHECK_THROWS_WITH(comm->all_gather(mine, big), Contains("expected out [4]"));
    // reduce_scatter_async (ZeRO-1's buckets): rank r gets the sum of everyone's chunk r.
    Tensor in = Tensor::from_vector({1.f * rank, 2.f * rank, 3.f * rank, 4.f * rank}, {4});
    Tensor out = Tensor::empty({1}, DType::F32);
    comm->reduce_scatter_async(in, out)->wait();
    CHECK(out.data<float>()[0] == 6.f * (rank + 1));  // (rank + 1) x (0 + 1 + 2 + 3)
  });
  for (const auto& e : errors) CHECK(e == "");
  for (int r = 1; r < 4; ++r) CHECK(std::memcmp(results[r].data(), results[0].data(), 12) == 0);
  CHECK(results[0][0] == Approx(1.0f));
}

TEST_CASE("the launch variables: torchrun-style, Slurm, and what is wrong with them") {
  test::EnvGuard guard({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
                        "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_JOB_NODELIST",
                        "SLURM_STEP_NODELIST", "SLURM_RESTART_COUNT", "OMPI_COMM_WORLD_RANK",
                        "PMIX_RANK", "PMI_RANK", "MOD_RENDEZVOUS_TOKEN",
                        "MOD_RENDEZVOUS_TIMEOUT_S", "TORCHELASTIC_RUN_ID"});
  setenv("WORLD_SIZE", "4", 1);
  CHECK_THROWS_WITH(launch_info_from_env(), Contains("WORLD_SIZE is set but RANK is not"));
  setenv("RANK", "x1", 1);
  CHECK_THROWS_WITH(launch_info_from_env(), Contains("RANK='x1' is not a non-negative integer"));
  setenv("RANK", "4", 1);
  setenv("LOCAL_RANK", "0", 1);
  CHECK_THROWS_WITH(launch_info_from_env(), Contains("RANK=4") && Contains("below WORLD_SIZE=4"));
  setenv("RANK", "3", 1);
  const LaunchInfo info = launch_info_from_env();
  CHECK((info.source == "torchrun" && info.rank == 3 && info.size == 4));

  const Bootstrap tcp = resolve_bootstrap(parse_bootstrap("auto"), info);
  CHECK(tcp.method == Bootstrap::Tcp);
  CHECK_THROWS_WITH(rendezvous_options_from_env(tcp, info),
                    Contains("MASTER_ADDR is not set") && Contains("SLURM_JOB_NODELIST"));
  setenv("SLURM_JOB_NODELIST", "gpu[07-09,12],login1", 1);
  RendezvousOptions o = rendezvous_options_from_env(tcp, info);
  CHECK(o.master_addr == "gpu07");
  CHECK(o.master_port == 29500);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  for (const char* bad : {"", "http", "0", "65536", "29500x"}) {
    CAPTURE(bad);
    setenv("MASTER_PORT", bad, 1);
    if (*bad == '\0') continue;  // empty counts as unset
    CHECK_THROWS_WITH(rendezvous_options_from_env(tcp, info),
                      Contains(std::string("MASTER_PORT='") + bad + "' is not a TCP port"));
  }
  setenv("MASTER_PORT", "29501", 1);
  o = rendezvous_options_from_env(tcp, info);
  CHECK((o.master_addr == "127.0.0.1" && o.master_port == 29501 && o.rank == 3 && o.size == 4));
  CHECK_THROWS_WITH(rendezvous_options_from_env(parse_bootstrap("file:/tmp"), info),
                    Contains("MOD_RENDEZVOUS_TOKEN"));
  setenv("MOD_RENDEZVOUS_TIMEOUT_S", "soon", 1);
  CHECK_THROWS_WITH(rendezvous_options_from_env(tcp, info), Contains("MOD_RENDEZVOUS_TIMEOUT_S='soon'"));
  unsetenv("MOD_RENDEZVOUS_TIMEOUT_S");

  setenv("PMIX_RANK", "3", 1);  // srun --mpi=pmix: MPI stays the default
  CHECK(resolve_bootstrap(parse_bootstrap("auto"), info).method == Bootstrap::Mpi);
  CHECK(resolve_bootstrap(parse_bootstrap("tcp"), info).method == Bootstrap::Tcp);
  CHECK(parse_bootstrap("file:/shared/r").dir == "/shared/r");
  CHECK_THROWS_WITH(parse_bootstrap("ucx"), Contains("expected auto, mpi, tcp or file:DIR"));
  CHECK_THROWS_WITH(parse_bootstrap("file:"), Contains("'file:'"));

  // srun --mpi=none: ranks from SLURM_*, rank 0's host the step's first node, token the job's.
  for (const char* v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "PMIX_RANK", "SLURM_JOB_NODELIST"})
    unsetenv(v);
  setenv("SLURM_PROCID", "1", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NTASKS", "2", 1);
  setenv("SLURM_JOB_ID", "4711", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  setenv("SLURM_STEP_NODELIST", "node[01-04,07]", 1);
  const LaunchInfo slurm = launch_info_from_env();
  CHECK((slurm.source == "Slurm" && slurm.rank == 1 && slurm.size == 2));
  o = rendezvous_options_from_env(resolve_bootstrap(parse_bootstrap("auto"), slurm), slurm);
  CHECK((o.master_addr == "node01" && o.master_port == 24711 && o.token == "slurm-4711.0.0"));
}

TEST_CASE("the first host of a compressed Slurm node list") {
  CHECK(first_host_of_nodelist("node[01-04,07]") == "node01");
  CHECK(first_host_of_nodelist("node07") == "node07");
  CHECK(first_host_of_nodelist("a1,b[2-3]") == "a1");
  CHECK(first_host_of_nodelist("gpu[3,5-6]") == "gpu3");
  CHECK(first_host_of_nodelist("rack[2-3]-n[010-012]") == "rack2-n010");
  CHECK(first_host_of_nodelist("c[9]x") == "c9x");
  for (const char* bad : {"", "node[01-04", "node]01", "[1-2]", "node[]", "node[a-b]"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(first_host_of_nodelist(bad), Contains("Slurm node list"));
  }
}

}  // namespace mod::parallel

namespace mod::parallel {

// Run as separate processes by scripts/launch_local_ranks.sh (tests/CMakeLists.txt): the world
// of a torchrun-style launch, met through MOD_TEST_BOOTSTRAP ("tcp" or "file:DIR").
TEST_CASE("processes started without MPI form one world", "[.processes]") {
  const char* bootstrap = std::getenv("MOD_TEST_BOOTSTRAP");
  init_world(nullptr, nullptr, bootstrap ? bootstrap : "auto");
  Communicator& comm = world();
  REQUIRE(world_joined());
  const int n = comm.size();
  CHECK(comm.rank() == launch_info().rank);
  CHECK(n == launch_info().size);
  CHECK_THROWS_WITH(require_mpi_world("train.device=CPU"),
                    Contains("train.device=CPU with " + std::to_string(n) + " processes needs MPI"));
  Tensor t = Tensor::from_vector({static_cast<double>(comm.rank() + 1)}, {1}, DType::F64);
  comm.all_reduce(t);
  CHECK(t.data<double>()[0] == n * (n + 1) / 2);
  auto tp = comm.split(comm.rank() / 2, comm.rank(), "tp");
  Tensor mine = Tensor::from_vector({static_cast<float>(comm.rank())}, {1});
  Tensor pair = Tensor::empty({tp->size()}, DType::F32);
  tp->all_gather(mine, pair);
  CHECK(pair.data<float>()[0] == comm.rank() / 2 * 2);
  Tensor id = Tensor::from_vector({comm.rank() == 0 ? 42.0 : 0.0}, {1}, DType::I32);
  comm.broadcast(id, 0);  // as NCCL's unique id travels
  CHECK(id.data<int32_t>()[0] == 42);
  comm.barrier();
  finalize_world();
}

}  // namespace mod::parallel
