// The process's device, compute stream and cuBLAS handles, made on first use.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"

namespace mod::cuda {

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0)
    throw std::invalid_argument(std::string(name) + "=" + v + ": expected a device number >= 0");
  return static_cast<int>(n);
}

constexpr size_t kCublasWorkspaceBytes = 32u << 20;

struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  void* cublas_workspace = nullptr;
  cublasLtHandle_t cublaslt = nullptr;
  void* cublaslt_workspace = nullptr;

  Context() {
    int count = 0;
    MOD_CUDA_CHECK(cudaGetDeviceCount(&count));
    // The launcher's local rank picks the GPU (one process per device); MOD_CUDA_DEVICE wins.
    const int local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK",
                                   env_int("LOCAL_RANK", env_int("SLURM_LOCALID", 0)));
    device = env_int("MOD_CUDA_DEVICE", local_rank % count);
    if (device >= count)
      throw std::invalid_argument("MOD_CUDA_DEVICE=" + std::to_string(device) + ": only " +
                                  std::to_string(count) + " CUDA device(s)");
    MOD_CUDA_CHECK(cudaSetDevice(device));
    MOD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("CUDA: cublasCreate failed on device " + std::to_string(device));
    // A fixed workspace keeps cuBLAS from allocating inside a captured CUDA graph.
    MOD_CUDA_CHECK(cudaMalloc(&cublas_workspace, kCublasWorkspaceBytes));
    bind_cublas(stream);
    if (cublasLtCreate(&cublaslt) != CUBLAS_STATUS_SUCCESS)
      throw std::runtime_error("CUDA: cublasLtCreate failed on device " + std::to_string(device));
    MOD_CUDA_CHECK(cudaMalloc(&cublaslt_workspace, kCublasLtWorkspaceBytes));
  }

  // cuBLAS documents that cublasSetStream "unconditionally resets the cuBLAS library workspace
  // back to the default workspace pool" (cuBLAS guide, cublasSetStream), so every stream change
  // sets the fixed workspace again: without it a GEMM captured after a StreamOverride (graphed
  // decode's conditional bodies) would allocate inside the capture.
  void bind_cublas(cudaStream_t s) const {
    cublasSetStream(cublas, s);
    cublasSetWorkspace(cublas, cublas_workspace, kCublasWorkspaceBytes);
  }
};

Context& context() {
  // Leaked on purpose: tensors in static storage may be freed after static destructors ran.
  static Context* ctx = new Context;
  return *ctx;
}

thread_local cudaStream_t stream_override = nullptr;  // StreamOverride's, else none
}  // namespace

int current_device() { return context().device; }
cudaStream_t compute_stream() { return stream_override ? stream_override : context().stream; }

StreamOverride::StreamOverride(cudaStream_t stream) : previous_(stream_override) {
  stream_override = stream;
  context().bind_cublas(stream);
}

StreamOverride::~StreamOverride() {
  stream_override = previous_;
  context().bind_cublas(compute_stream());
}
cublasHandle_t cublas_handle() { return context().cublas; }
cublasLtHandle_t cublaslt_handle() { return context().cublaslt; }
void* cublaslt_workspace() { return context().cublaslt_workspace; }
void synchronize() { MOD_CUDA_CHECK(cudaStreamSynchronize(context().stream)); }

}  // namespace mod::cuda
