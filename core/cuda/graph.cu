// CUDA graphs: a training step captured once on the compute stream and replayed with one
// launch. Capture runs in thread-local mode (a host synchronisation on this thread, such as a
// copy to host memory, fails the capture instead of silently running); allocations made while
// capturing come from the graph's private pool (allocator.h), so the addresses the graph baked
// in stay its own.
//
// run_if_any inside a capture: a one-warp kernel sets a conditional handle from the flags, an
// IF node follows it in the graph, and the body is captured into the node's child graph on a
// side stream (StreamOverride points compute_stream() and cuBLAS at it meanwhile). Work after it
// on the compute stream depends on the IF node, so the graph's order is the eager one.
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "core/cuda/allocator.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"

namespace mod::cuda {

namespace {
int capture_pool = 0;

// CUDA 13 dropped the suffixes that 12.3-12.9 give the edge-data forms of these calls.
#if CUDART_VERSION >= 13000
#define MOD_HAVE_CONDITIONAL_NODES 1
#define MOD_CAPTURE_INFO cudaStreamGetCaptureInfo
#define MOD_GRAPH_ADD_NODE cudaGraphAddNode
#define MOD_UPDATE_CAPTURE_DEPENDENCIES cudaStreamUpdateCaptureDependencies
#elif CUDART_VERSION >= 12030
#define MOD_HAVE_CONDITIONAL_NODES 1
#define MOD_CAPTURE_INFO cudaStreamGetCaptureInfo_v3
#define MOD_GRAPH_ADD_NODE cudaGraphAddNode_v2
#define MOD_UPDATE_CAPTURE_DEPENDENCIES cudaStreamUpdateCaptureDependencies_v2
#else
#define MOD_HAVE_CONDITIONAL_NODES 0
#endif

#if MOD_HAVE_CONDITIONAL_NODES
// One warp: the handle's value is 1 iff some flag is nonzero.
__global__ void set_if_any(cudaGraphConditionalHandle handle, const int64_t* flags, int64_t n) {
  bool any = false;
  for (int64_t i = threadIdx.x; i < n; i += 32) any = any || flags[i] != 0;
  any = __any_sync(0xffffffffu, any);
  if (threadIdx.x == 0) cudaGraphSetConditional(handle, any ? 1u : 0u);
}

cudaStream_t body_stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    MOD_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
  }();
  return stream;
}
#endif

class CudaGraph final : public CapturedWork {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec, int pool)
      : graph_(graph), exec_(exec), pool_(pool) {}
  ~CudaGraph() override {
    // The graph may still be running: its pool returns to general use only after it finished.
    cudaStreamSynchronize(compute_stream());
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
    release_graph_pool(pool_);
  }
  void replay() override { MOD_CUDA_CHECK(cudaGraphLaunch(exec_, compute_stream())); }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  int pool_;
};
}  // namespace

void CudaBackend::begin_capture() {
  capture_pool = begin_graph_pool();
  const cudaError_t err =
      cudaStreamBeginCapture(compute_stream(), cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    end_graph_pool();
    release_graph_pool(capture_pool);
    throw std::runtime_error(std::string("CUDA graph: cudaStreamBeginCapture failed: ") +
                             cudaGetErrorString(err));
  }
}

std::unique_ptr<CapturedWork> CudaBackend::end_capture() {
  end_graph_pool();
  const int pool = capture_pool;
  capture_pool = 0;
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(compute_stream(), &graph);
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    release_graph_pool(pool);
    throw std::runtime_error(std::string("CUDA graph: capturing the step failed (") +
                             cudaGetErrorString(err) +
                             "); something in it synchronised with the host or used another "
                             "stream. Run without train.cuda_graph");
  }
  return std::make_unique<CudaGraph>(graph, exec, pool);
}

void CudaBackend::run_if_any(const Tensor& flags, const std::function<void()>& body) {
  if (flags.device() != Device::CUDA || flags.dtype() != DType::I64 || flags.dim() != 1)
    throw std::invalid_argument("run_if_any: flags " + mod::describe(flags) +
                                " must be i64 [N] on the CUDA device");
#if MOD_HAVE_CONDITIONAL_NODES
  const cudaStream_t main = compute_stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t n_deps = 0;
  MOD_CUDA_CHECK(MOD_CAPTURE_INFO(main, &status, nullptr, &graph, nullptr, nullptr, nullptr));
  if (status != cudaStreamCaptureStatusActive || flags.numel() == 0) return body();
  cudaGraphConditionalHandle handle;
  const cudaError_t made = cudaGraphConditionalHandleCreate(&handle, graph, 0, 0);
  if (made != cudaSuccess) {
    // A driver older than the toolkit refuses conditional nodes: the body is captured inline,
    // masked as an eager step runs it, so the graph still decodes the same tokens.
    cudaGetLastError();
    static const bool noted = [made] {
      std::fprintf(stderr, "note: CUDA graph: no conditional nodes here (%s); routed blocks run "
                   "masked in every captured step\n", cudaGetErrorString(made));
      return true;
    }();
    (void)noted;
    return body();
  }
  set_if_any<<<1, 32, 0, main>>>(handle, flags.data<int64_t>(), flags.numel());
  MOD_CUDA_CHECK_LAUNCH();
  MOD_CUDA_CHECK(MOD_CAPTURE_INFO(main, &status, nullptr, &graph, &deps, nullptr, &n_deps));
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  cudaGraphNode_t node = nullptr;
  MOD_CUDA_CHECK(MOD_GRAPH_ADD_NODE(&node, graph, deps, nullptr, n_deps, &params));
  MOD_CUDA_CHECK(MOD_UPDATE_CAPTURE_DEPENDENCIES(main, &node, nullptr, 1,
                                                 cudaStreamSetCaptureDependencies));
  const cudaStream_t side = body_stream();
  MOD_CUDA_CHECK(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[0], nullptr,
                                               nullptr, 0, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t captured = nullptr;
  try {
    StreamOverride on_side(side);
    body();
  } catch (...) {
    cudaStreamEndCapture(side, &captured);
    cudaGetLastError();
    throw;
  }
  MOD_CUDA_CHECK(cudaStreamEndCapture(side, &captured));
#else
  body();  // no conditional nodes before CUDA 12.3: the body always runs (masked)
#endif
}

}  // namespace mod::cuda
