// CUDA graphs: a training step captured once on the compute stream and replayed with one
// launch. Capture runs in thread-local mode (a host synchronisation on this thread, such as a
// copy to host memory, fails the capture instead of silently running); allocations made while
// capturing come from the graph's private pool (allocator.h), so the addresses the graph baked
// in stay its own.
#include <cuda_runtime.h>

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

}  // namespace mod::cuda
