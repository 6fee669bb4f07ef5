// The stream every modtrain kernel, copy and library call runs on, and the per-device library
// handles bound to it. One stream per process keeps kernels in order without events; NCCL's
// gradient buckets use their own stream ordered by events (parallel/nccl_communicator.cpp).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace mod::cuda {

// Selects the device this process uses (MOD_CUDA_DEVICE, else the launcher's local rank modulo
// the device count) on first use.
int current_device();
cudaStream_t compute_stream();
cublasHandle_t cublas_handle();  // bound to compute_stream(), with its own workspace
// cuBLASLt (GEMMs with epilogues) takes the stream per call; its workspace is fixed, so a
// captured graph never allocates, and used on the compute stream only.
cublasLtHandle_t cublaslt_handle();
constexpr size_t kCublasLtWorkspaceBytes = 32u << 20;
void* cublaslt_workspace();
// Blocks the host until every queued kernel and copy has finished.
void synchronize();

// While one lives, compute_stream() on this thread is `stream` and cuBLAS is bound to it: the
// body of a conditional graph node is captured on a stream of its own (graph.cu, run_if_any).
class StreamOverride {
 public:
  explicit StreamOverride(cudaStream_t stream);
  ~StreamOverride();
  StreamOverride(const StreamOverride&) = delete;
  StreamOverride& operator=(const StreamOverride&) = delete;

 private:
  cudaStream_t previous_;
};

}  // namespace mod::cuda
