// The NCCL stand-in (emulator/libs/nccl.cpp) against the rules it cites, each case two ranks:
// this process and a forked child, meeting through a unique id made before the fork (the child
// inherits rank 0's listener, as a launcher passes the id; each has its own NCCL_HOSTID, as two
// ranks on one GPU need). What NCCL documents: non-blocking
// init in progress, then ready; ncclAvg and narrow types; ncclCommAbort waking a rank that
// waits; a peer that exits making the next operation fail with ncclRemoteError. What the
// stand-in adds where NCCL would hang: ranks calling different operations get an error naming
// both. tests/parallel/nccl_test.cpp covers every collective through the communicator.
#include <nccl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "emulator/include/emu/cuda.h"

namespace {

// Runs body(rank) in this process as rank 0 and in a forked child as rank 1; the child's
// failures show as its exit status, which the parent checks.
void two_ranks(const std::function<bool(int, ncclUniqueId)>& body) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  // One emulated GPU shared by both: each rank its own NCCL_HOSTID, or NCCL refuses the pair.
  setenv("NCCL_HOSTID", child == 0 ? "nccl-test-rank-1" : "nccl-test-rank-0", 1);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a parent the watchdog ends
    _exit(body(1, id) ? 0 : 1);
  }
  const bool ok = body(0, id);
  unsetenv("NCCL_HOSTID");
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(ok);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

ncclComm_t init(int rank, ncclUniqueId id) {
  ncclComm_t comm = nullptr;
  return ncclCommInitRank(&comm, 2, id, rank) == ncclSuccess ? comm : nullptr;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* d = nullptr;
  if (cudaMalloc(&d, host.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(d);
}

template <typename T>
std::vector<T> host_copy(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}

}  // namespace

TEST_CASE("NCCL stand-in: a non-blocking init is in progress, then ready", "[nccl]") {
  two_ranks([](int rank, ncclUniqueId id) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    if (ncclCommInitRankConfig(&comm, 2, id, rank, &config) != ncclInProgress) return false;
    ncclResult_t state = ncclInProgress;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (state == ncclInProgress && std::chrono::steady_clock::now() < until)
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return false;
    if (state != ncclSuccess)
      std::fprintf(stderr, "rank %d: %d, '%s'\n", rank, int(state), ncclGetLastError(comm));
    return state == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess;
  });
}

TEST_CASE("NCCL stand-in: average over ranks, in f32 and bf16, the same bits on each rank",
          "[nccl]") {
  two_ranks([](int rank, ncclUniqueId id) {
    ncclComm_t comm = init(rank, id);
    if (comm == nullptr) return false;
    float* x = device_copy(std::vector<float>{1.0f + rank, -3.0f * rank, 0.25f});
    // bf16 1.0 and 2.0 on the ranks: the mean 1.5 is exact in bf16.
    const uint16_t one = 0x3f80, two = 0x4000;
    uint16_t* h = device_copy(std::vector<uint16_t>{rank == 0 ? one : two});
    bool ok = ncclAllReduce(x, x, 3, ncclFloat32, ncclAvg, comm, nullptr) == ncclSuccess &&
              ncclAllReduce(h, h, 1, ncclBfloat16, ncclAvg, comm, nullptr) == ncclSuccess;
    ok = ok && host_copy(x, 3) == std::vector<float>{1.5f, -1.5f, 0.25f};
    ok = ok && host_copy(h, 1)[0] == 0x3fc0;  // 1.5
    return ok && ncclCommDestroy(comm) == ncclSuccess;
  });
}

// A GPU runs a stream's queued collective whether or not its host synchronises (emulator/
// README.md "The runtime"): rank 1 queues an all-reduce on a stream and then blocks outside CUDA
// (in read(), as a host all-reduce over MPI would) until rank 0, which synchronises, has its
// result. Without the runtime's progress neither would move: rank 1 gives up after 20 s.
TEST_CASE("NCCL stand-in: a queued collective runs while its host blocks outside CUDA", "[nccl]") {
  int done[2];
  REQUIRE(pipe(done) == 0);
  two_ranks([&](int rank, ncclUniqueId id) {
    ncclComm_t comm = init(rank, id);
    cudaStream_t stream = nullptr;
    if (comm == nullptr || cudaStreamCreate(&stream) != cudaSuccess) return false;
    float* x = device_copy(std::vector<float>{1.0f + rank});
    bool ok = ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, comm, stream) == ncclSuccess;
    if (rank == 0) {
      ok = ok && cudaStreamSynchronize(stream) == cudaSuccess && host_copy(x, 1)[0] == 3.0f;
      const char byte = ok ? 1 : 0;
      ok = write(done[1], &byte, 1) == 1 && ok;
    } else {
      pollfd p{done[0], POLLIN, 0};
      char byte = 0;
      const int polled = ok ? poll(&p, 1, 20000) : -2;
      ok = polled == 1 && read(done[0], &byte, 1) == 1 && byte == 1;
      if (!ok)
        std::fprintf(stderr, "rank 1: rank 0 did not get the sum while rank 1 waited (%d %d)\n",
                     polled, int(byte));
      cudaStreamSynchronize(stream);  // lets rank 0 finish either way
    }
    return ok && ncclCommDestroy(comm) == ncclSuccess;
  });
  close(done[0]);
  close(done[1]);
}

TEST_CASE("NCCL stand-in: ranks calling different operations get an error naming both", "[nccl]") {
  two_ranks([](int rank, ncclUniqueId id) {
    ncclComm_t comm = init(rank, id);
    if (comm == nullptr) return false;
    float* x = device_copy(std::vector<float>(8, 1.0f));
    const ncclResult_t rc = rank == 0 ? ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, nullptr)
                                      : ncclAllGather(x, x, 4, ncclFloat32, comm, nullptr);
    const std::string why = ncclGetLastError(comm);
    const bool ok = rc == ncclRemoteError && why.find("ncclAllReduce") != std::string::npos &&
                    why.find("ncclAllGather") != std::string::npos;
    if (!ok) std::fprintf(stderr, "rank %d: %d, '%s'\n", rank, int(rc), why.c_str());
    // The peer reads this rank's frame before the abort closes the connection.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ncclCommAbort(comm);
    return ok;
  });
}

TEST_CASE("NCCL stand-in: ncclCommAbort wakes a rank waiting for a peer that never sends",
          "[nccl]") {
  two_ranks([](int rank, ncclUniqueId id) {
    ncclComm_t comm = init(rank, id);
    if (comm == nullptr) return false;
    if (rank == 1) {  // stays until rank 0 has given up on it
      std::this_thread::sleep_for(std::chrono::seconds(3));
      ncclCommAbort(comm);
      return true;
    }
    float* x = device_copy(std::vector<float>(4, 0.0f));
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ncclCommAbort(comm);
    });
    const auto start = std::chrono::steady_clock::now();
    const ncclResult_t rc = ncclRecv(x, 4, ncclFloat32, 1, comm, nullptr);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    aborter.join();
    return rc != ncclSuccess && waited < 2.5;
  });
}

TEST_CASE("NCCL stand-in: a peer that exits makes the next operation a remote error", "[nccl]") {
  two_ranks([](int rank, ncclUniqueId id) {
    ncclComm_t comm = init(rank, id);
    if (comm == nullptr) return false;
    if (rank == 1) _exit(0);  // gone without a word
    float* x = device_copy(std::vector<float>(4, 1.0f));
    const ncclResult_t rc = ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, nullptr);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const bool ok = rc == ncclRemoteError && async == ncclRemoteError &&
                    std::string(ncclGetLastError(comm)).find("closed") != std::string::npos;
    if (!ok)
      std::fprintf(stderr, "rank 0: %d %d '%s'\n", int(rc), int(async), ncclGetLastError(comm));
    ncclCommAbort(comm);
    return ok;
  });
}

TEST_CASE("NCCL stand-in: a host buffer is refused, naming it", "[nccl]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  std::vector<float> host(4, 1.0f);
  CHECK(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm, nullptr) ==
        ncclInvalidArgument);
  CHECK_THAT(ncclGetLastError(comm), Catch::Contains("sendbuff") && Catch::Contains("device"));
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}
