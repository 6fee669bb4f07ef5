// The emulator's CUDA runtime against the rules it cites (emulator/README.md, "The runtime"):
// capture records instead of running and what invalidates it, forks and joins by events, graph
// replay on the captured memory, conditional IF nodes, errors last and sticky, device memory
// poisoned, guarded and closed to the host. Faults are checked in a forked child.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "emulator/include/emu/cuda.h"

namespace {

__global__ void add_one(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

__global__ void set_from_flag(cudaGraphConditionalHandle h, const int* flag) {
  if (threadIdx.x == 0) cudaGraphSetConditional(h, *flag != 0 ? 1u : 0u);
}

// What the rewritten `add_one<<<blocks, 64, 0, s>>>(x, n)` becomes (emulator/tools/cu_to_cpp.py).
void launch_add_one(float* x, int n, cudaStream_t s) {
  ::emu::rt::launch_kernel(
      ::emu::rt::launch_args((n + 63) / 64, 64, 0, s), "add_one",
      [=](const auto&... p) { add_one(p...); },
      []<class... A>() -> const void* {
        return reinterpret_cast<const void*>(static_cast<void (*)(A...)>(add_one));
      },
      x, n);
}

std::vector<float> read(const float* d, int n) {
  std::vector<float> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}

float* device_zeros(int n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(p, 0, n * sizeof(float)) == cudaSuccess);
  return static_cast<float*>(p);
}

// Runs `body` in a child process; true if the child died of SIGSEGV.
bool dies_of_segv(const std::function<void()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // not left behind by a parent the watchdog ends
    signal(SIGSEGV, SIG_DFL);
    body();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

struct Stream {
  cudaStream_t s = nullptr;
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    REQUIRE(cudaStreamCreateWithFlags(&s, flags) == cudaSuccess);
  }
  ~Stream() { cudaStreamDestroy(s); }
};

}  // namespace

TEST_CASE("runtime: a captured stream records kernels, which run at each graph launch",
          "[emulator]") {
  Stream stream;
  float* x = device_zeros(100);
  REQUIRE(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  launch_add_one(x, 100, stream.s);
  launch_add_one(x, 100, stream.s);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamEndCapture(stream.s, &graph) == cudaSuccess);
  CHECK(read(x, 100) == std::vector<float>(100, 0.0f));  // captured, not run
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int i = 0; i < 3; ++i) REQUIRE(cudaGraphLaunch(exec, stream.s) == cudaSuccess);
  CHECK(read(x, 100) == std::vector<float>(100, 6.0f));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(x);
}

TEST_CASE("runtime: what CUDA prohibits during a capture invalidates it", "[emulator]") {
  Stream stream;
  float* x = device_zeros(8);
  std::vector<float> host(8);
  const auto capture_fails_with = [&](const std::function<cudaError_t()>& call,
                                      cudaError_t expected) {
    REQUIRE(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    launch_add_one(x, 8, stream.s);
    CHECK(call() == expected);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(stream.s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr);
    cudaGetLastError();
  };
  SECTION("synchronising the stream") {
    capture_fails_with([&] { return cudaStreamSynchronize(stream.s); },
                       cudaErrorStreamCaptureUnsupported);
  }
  SECTION("cudaMalloc outside relaxed mode") {
    void* p = nullptr;
    capture_fails_with([&] { return cudaMalloc(&p, 64); }, cudaErrorStreamCaptureUnsupported);
  }
  SECTION("a copy to pageable host memory") {
    capture_fails_with(
        [&] {
          return cudaMemcpyAsync(host.data(), x, 8 * sizeof(float), cudaMemcpyDeviceToHost,
                                 stream.s);
        },
        cudaErrorStreamCaptureUnsupported);
  }
  SECTION("the legacy stream while a blocking stream is captured") {
    Stream blocking(cudaStreamDefault);
    REQUIRE(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMemsetAsync(x, 0, 8 * sizeof(float), nullptr) == cudaErrorStreamCaptureImplicit);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(blocking.s, &graph) == cudaErrorStreamCaptureInvalidated);
    cudaGetLastError();
  }
  SECTION("relaxed mode allows cudaMalloc, and the capture survives") {
    REQUIRE(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    void* p = nullptr;
    CHECK(cudaMalloc(&p, 64) == cudaSuccess);
    REQUIRE(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(stream.s, &graph) == cudaSuccess);
    cudaGraphDestroy(graph);
    cudaFree(p);
  }
  cudaFree(x);
}

TEST_CASE("runtime: a stream forked by an event must be joined back before the capture ends",
          "[emulator]") {
  Stream main, side;
  cudaEvent_t fork = nullptr, join = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&join, cudaEventDisableTiming) == cudaSuccess);
  float* x = device_zeros(64);
  for (const bool joined : {true, false}) {
    INFO("joined " << joined);
    REQUIRE(cudaStreamBeginCapture(main.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    REQUIRE(cudaEventRecord(fork, main.s) == cudaSuccess);
    REQUIRE(cudaStreamWaitEvent(side.s, fork, 0) == cudaSuccess);
    launch_add_one(x, 64, side.s);  // side joined the capture: recorded, not run
    if (joined) {
      REQUIRE(cudaEventRecord(join, side.s) == cudaSuccess);
      REQUIRE(cudaStreamWaitEvent(main.s, join, 0) == cudaSuccess);
    }
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(main.s, &graph) ==
          (joined ? cudaSuccess : cudaErrorStreamCaptureUnjoined));
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    CHECK(read(x, 64) == std::vector<float>(64, 0.0f));
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaFree(x);
}

TEST_CASE("runtime: a conditional IF node runs its body when a kernel set its handle",
          "[emulator]") {
  Stream main, side;
  float* x = device_zeros(32);
  int* flag = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&flag), sizeof(int)) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(main.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  REQUIRE(cudaStreamGetCaptureInfo(main.s, &status, nullptr, &graph) == cudaSuccess);
  REQUIRE(status == cudaStreamCaptureStatusActive);
  cudaGraphConditionalHandle handle = 0;
  REQUIRE(cudaGraphConditionalHandleCreate(&handle, graph, 0, cudaGraphCondAssignDefault) ==
          cudaSuccess);
  ::emu::rt::launch_kernel(
      ::emu::rt::launch_args(1, 32, 0, main.s), "set_from_flag",
      [=](const auto&... p) { set_from_flag(p...); },
      []<class... A>() -> const void* { return nullptr; }, handle, static_cast<const int*>(flag));
  const cudaGraphNode_t* deps = nullptr;
  size_t n_deps = 0;
  REQUIRE(cudaStreamGetCaptureInfo(main.s, &status, nullptr, &graph, &deps, nullptr, &n_deps) ==
          cudaSuccess);
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  REQUIRE(cudaGraphAddNode(&node, graph, deps, nullptr, n_deps, &params) == cudaSuccess);
  REQUIRE(cudaStreamUpdateCaptureDependencies(main.s, &node, nullptr, 1,
                                              cudaStreamSetCaptureDependencies) == cudaSuccess);
  REQUIRE(cudaStreamBeginCaptureToGraph(side.s, params.conditional.phGraph_out[0], nullptr, nullptr,
                                        0, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  launch_add_one(x, 32, side.s);
  cudaGraph_t body = nullptr;
  REQUIRE(cudaStreamEndCapture(side.s, &body) == cudaSuccess);
  cudaGraph_t whole = nullptr;
  REQUIRE(cudaStreamEndCapture(main.s, &whole) == cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  REQUIRE(cudaGraphInstantiate(&exec, whole, 0) == cudaSuccess);
  float want = 0;
  for (const int f : {0, 1, 0, 1, 1}) {
    REQUIRE(cudaMemcpy(flag, &f, sizeof f, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, main.s) == cudaSuccess);
    want += f;
    CHECK(read(x, 32) == std::vector<float>(32, want));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(whole);
  cudaFree(flag);
  cudaFree(x);
}

TEST_CASE("runtime: device memory is poisoned, guarded, and closed to the host", "[emulator]") {
  float* x = nullptr;
  REQUIRE(cudaMalloc(reinterpret_cast<void**>(&x), 100 * sizeof(float)) == cudaSuccess);
  for (const float v : read(x, 100)) CHECK(std::isnan(v));  // 0xFF bytes: what nothing wrote
  // A host read of a device pointer faults, as it does without unified memory.
  CHECK(dies_of_segv([&] {
    volatile float v = x[0];
    (void)v;
  }));
  // A kernel running past the allocation's (256-byte rounded) end meets the guard page.
  CHECK(dies_of_segv([&] { launch_add_one(x, 100 + 64 + 1024, nullptr); }));
  // Copies touch it freely; its address is unchanged by them.
  const std::vector<float> ones(100, 1.0f);
  REQUIRE(cudaMemcpy(x, ones.data(), 400, cudaMemcpyHostToDevice) == cudaSuccess);
  launch_add_one(x, 100, nullptr);
  CHECK(read(x, 100) == std::vector<float>(100, 2.0f));
  // A copy whose pointers do not match its kind is refused (undefined in CUDA).
  std::vector<float> host(100);
  CHECK(cudaMemcpy(host.data(), ones.data(), 400, cudaMemcpyDeviceToHost) != cudaSuccess);
  cudaFree(x);
}

TEST_CASE("runtime: a bad configuration is the last error, a fault the sticky one", "[emulator]") {
  float* x = device_zeros(4);
  ::emu::rt::launch_kernel(
      ::emu::rt::launch_args(1, 2048, 0, nullptr), "add_one",
      [=](const auto&... p) { add_one(p...); }, []<class... A>() -> const void* { return nullptr; },
      x, 4);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  ::emu::rt::fail_sticky(cudaErrorIllegalAddress, "a planted fault");
  CHECK(cudaMemsetAsync(x, 0, 16, nullptr) == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);
  CHECK(cudaGetLastError() == cudaErrorIllegalAddress);  // sticky
  ::emu::rt::reset_for_tests();
  cudaFree(x);
}

TEST_CASE("runtime: streams run late, the latest issued first, unless an event orders them",
          "[emulator]") {
  Stream a, b;
  float* x = device_zeros(64);
  float* y = device_zeros(64);
  float* pinned = nullptr;
  REQUIRE(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64 * sizeof(float)) == cudaSuccess);
  pinned[0] = -1.0f;

  // Nothing runs before the host synchronises: a copy into pinned memory has not landed.
  launch_add_one(x, 64, a.s);
  REQUIRE(cudaMemcpyAsync(pinned, x, 64 * sizeof(float), cudaMemcpyDeviceToHost, a.s) ==
          cudaSuccess);
  CHECK(pinned[0] == -1.0f);
  REQUIRE(cudaStreamSynchronize(a.s) == cudaSuccess);
  CHECK(pinned[0] == 1.0f);

  // b reads x with no event after a's kernel: b's copy, issued later, runs first.
  launch_add_one(x, 64, a.s);
  REQUIRE(cudaMemcpyAsync(y, x, 64 * sizeof(float), cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(read(y, 64) == std::vector<float>(64, 1.0f));  // the value before the kernel
  CHECK(read(x, 64) == std::vector<float>(64, 2.0f));

  // With the event the copy waits for the kernel.
  cudaEvent_t done = nullptr;
  REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming) == cudaSuccess);
  launch_add_one(x, 64, a.s);
  REQUIRE(cudaEventRecord(done, a.s) == cudaSuccess);
  REQUIRE(cudaStreamWaitEvent(b.s, done, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(y, x, 64 * sizeof(float), cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK(read(y, 64) == std::vector<float>(64, 3.0f));

  // An event recorded before the kernel orders nothing after it.
  REQUIRE(cudaEventRecord(done, a.s) == cudaSuccess);
  launch_add_one(x, 64, a.s);
  REQUIRE(cudaStreamWaitEvent(b.s, done, 0) == cudaSuccess);
  REQUIRE(cudaMemcpyAsync(y, x, 64 * sizeof(float), cudaMemcpyDeviceToDevice, b.s) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(read(y, 64) == std::vector<float>(64, 3.0f));
  CHECK(read(x, 64) == std::vector<float>(64, 4.0f));

  cudaEventDestroy(done);
  cudaFreeHost(pinned);
  cudaFree(x);
  cudaFree(y);
}

TEST_CASE("runtime: pageable memory is staged when a copy is issued, and read back before it "
          "returns",
          "[emulator]") {
  Stream a;
  float* x = device_zeros(16);
  std::vector<float> host(16, 5.0f);
  REQUIRE(cudaMemcpyAsync(x, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice, a.s) ==
          cudaSuccess);
  host.assign(16, 7.0f);  // CUDA lets the host reuse a pageable source once the call returns
  launch_add_one(x, 16, a.s);
  std::vector<float> back(16, 0.0f);
  REQUIRE(cudaMemcpyAsync(back.data(), x, 16 * sizeof(float), cudaMemcpyDeviceToHost, a.s) ==
          cudaSuccess);
  CHECK(back == std::vector<float>(16, 6.0f));  // no synchronisation needed
  cudaFree(x);
}
