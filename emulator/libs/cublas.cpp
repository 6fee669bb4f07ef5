// The cuBLAS stand-in: the handle, its stream and workspace, and cublasGemmStridedBatchedEx,
// defined under the toolkit's own declarations (cublas_v2.h renames cublasCreate and the other
// handle calls to their _v2 symbols) so that core/cuda/ops/matmul.cu and core/cuda/stream.cu link
// against it unchanged. Arguments are checked when called, with the statuses the cuBLAS guide
// documents; the GEMM itself is queued on the handle's stream (emu::rt::enqueue), so it runs in
// order with the stream's kernels or is recorded into the graph the stream is captured into.
//
// Workspace, the stand-in's model of what the guide documents:
// - cublasSetWorkspace gives the handle a user-owned buffer "used to execute all subsequent calls
//   ... (on the currently set stream)"; "including with workspaceSizeInBytes equal to 0, [it]
//   will prevent the cuBLAS library from utilizing the default workspace", a too small size "may
//   cause some routines to fail with CUBLAS_STATUS_ALLOC_FAILED", and 16 KiB or more prevents
//   that (cuBLAS guide, cublasSetWorkspace).
// - cublasSetStream "unconditionally resets the cuBLAS library workspace back to the default
//   workspace pool" (cuBLAS guide, cublasSetStream).
// - Captured, a routine on the default pool allocates its workspace in the capture, through
//   stream-ordered allocation (cuBLAS guide, "CUDA Graphs Support": routines "can create memory
//   nodes"; hence its advice to set a user workspace with cublasSetWorkspace).
// The stand-in: a GEMM needs workspace when m n k >= 2^20 or batch > 1 (real cuBLAS decides per
// algorithm; the rule is fixed so tests can rely on it), and then kNeedBytes (16 KiB). On a user
// workspace it needs that many bytes, else CUBLAS_STATUS_ALLOC_FAILED, never the default pool.
// On the default pool it calls emu::rt::device_malloc: once per (handle, stream) outside a
// capture (cached), and at every call inside one (the memory node), where the runtime refuses
// in global and thread-local mode, and the GEMM returns CUBLAS_STATUS_ALLOC_FAILED.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "common.h"
#include "emu/runtime.h"
#include "gemm.h"

namespace {
constexpr size_t kNeedBytes = 16 << 10;
// What one default-pool allocation takes: the guide's suggested workspace for GPUs before
// Hopper (cuBLAS guide, cublasSetWorkspace), ample for kNeedBytes.
constexpr size_t kDefaultPoolBytes = 4 << 20;
// cublasSetWorkspace: "The workspace pointer has to be aligned to at least 256 bytes".
constexpr uintptr_t kWorkspaceAlignment = 256;
}  // namespace

struct cublasContext {
  cudaStream_t stream = nullptr;
  bool user_workspace = false;  // false: the default pool
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<cudaStream_t, void*> pool;  // the default pool's workspace per stream
};

namespace {

bool needs_workspace(int64_t m, int64_t n, int64_t k, int64_t batch) {
  return m * n * k >= (int64_t{1} << 20) || batch > 1;
}

// The workspace one GEMM runs on, or the status that refuses it.
cublasStatus_t take_workspace(cublasContext* h, void** out) {
  if (h->user_workspace) {
    if (h->workspace_bytes < kNeedBytes) return CUBLAS_STATUS_ALLOC_FAILED;
    *out = h->workspace;
    return CUBLAS_STATUS_SUCCESS;
  }
  const bool captured = emu::rt::capturing(h->stream);
  if (!captured) {
    const auto it = h->pool.find(h->stream);
    if (it != h->pool.end()) {
      *out = it->second;
      return CUBLAS_STATUS_SUCCESS;
    }
  }
  emu::blas::pool_allocations.fetch_add(1);
  void* p = nullptr;
  if (emu::rt::device_malloc(&p, kDefaultPoolBytes, "cuBLAS default workspace pool") != cudaSuccess)
    return CUBLAS_STATUS_ALLOC_FAILED;
  if (!captured) h->pool[h->stream] = p;
  *out = p;
  return CUBLAS_STATUS_SUCCESS;
}

bool valid_op(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

// The type combinations the backend uses (core/cuda/ops/matmul.cu): f32 in full f32 (no TF32),
// bf16 into bf16 or f32 with f32 compute, f64.
bool supported(cudaDataType a, cudaDataType b, cudaDataType c, cublasComputeType_t compute) {
  if (a != b) return false;
  if (a == CUDA_R_32F)
    return c == CUDA_R_32F &&
           (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC);
  if (a == CUDA_R_16BF)
    return (c == CUDA_R_16BF || c == CUDA_R_32F) &&
           (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC);
  if (a == CUDA_R_64F)
    return c == CUDA_R_64F &&
           (compute == CUBLAS_COMPUTE_64F || compute == CUBLAS_COMPUTE_64F_PEDANTIC);
  return false;
}

bool valid_algo(cublasGemmAlgo_t algo) {
  return (algo >= CUBLAS_GEMM_DEFAULT && algo <= CUBLAS_GEMM_ALGO23) ||
         (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP);
}

}  // namespace

extern "C" {

// cuBLAS guide, cublasCreate: CUBLAS_STATUS_INVALID_VALUE for handle == NULL.
cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

// The default pool's buffers stay in the arena (emulator/include/emu/runtime.h has no free); a graph captured
// with one may still run.
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS guide, cublasSetStream: also "unconditionally resets the cuBLAS library workspace back
// to the default workspace pool".
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  handle->user_workspace = false;
  handle->workspace = nullptr;
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS guide, cublasGetStream: CUBLAS_STATUS_INVALID_VALUE for streamId == NULL.
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS guide, cublasSetWorkspace: CUBLAS_STATUS_INVALID_VALUE for a pointer not aligned to
// 256 bytes.
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0)
    return CUBLAS_STATUS_INVALID_VALUE;
  handle->user_workspace = true;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unrecognized>";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "<unrecognized>";
}

// Statuses from the cuBLAS guide, cublasGemmEx and cublasGemmStridedBatchedEx: INVALID_VALUE for
// m, n, k or batchCount < 0, an unknown transa/transb, lda < max(1, rows of A as stored)
// (likewise ldb, ldc); NOT_SUPPORTED for a type combination or algo not supported. A null alpha
// or beta is INVALID_VALUE too (the stand-in's: they are read at call time, pointer mode host).
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  static constexpr const char* kCall = "cublasGemmStridedBatchedEx";
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_op(transa) || !valid_op(transb)) return CUBLAS_STATUS_INVALID_VALUE;
  if (m < 0 || n < 0 || k < 0 || batchCount < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;  // C is T for real types
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (alpha == nullptr || beta == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (!supported(Atype, Btype, Ctype, computeType) || !valid_algo(algo))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;

  emu::blas::Gemm g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = batchCount;
  g.trans_a = ta;
  g.trans_b = tb;
  emu::blas::to_type(Atype, &g.a.type);
  emu::blas::to_type(Btype, &g.b.type);
  emu::blas::to_type(Ctype, &g.c.type);
  g.a = {A, g.a.type, lda, strideA};
  g.b = {B, g.b.type, ldb, strideB};
  g.c = {C, g.c.type, ldc, strideC};
  g.d = g.c;
  // Pointer mode host: the scalars are read now, so a capture records their values (cuBLAS
  // guide, "CUDA Graphs Support").
  const bool f64 = computeType == CUBLAS_COMPUTE_64F || computeType == CUBLAS_COMPUTE_64F_PEDANTIC;
  g.alpha = f64 ? *static_cast<const double*>(alpha) : *static_cast<const float*>(alpha);
  g.beta = f64 ? *static_cast<const double*>(beta) : *static_cast<const float*>(beta);

  void* workspace = nullptr;
  if (needs_workspace(m, n, k, batchCount)) {
    const cublasStatus_t s = take_workspace(handle, &workspace);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  const cudaError_t e = emu::rt::enqueue(handle->stream, kCall, [g, workspace] {
    using emu::blas::check_range;
    const bool a_ok = g.k == 0 || check_range(kCall, "A", g.a, g.trans_a ? g.k : g.m,
                                              g.trans_a ? g.m : g.k, g.batch);
    const bool b_ok = g.k == 0 || check_range(kCall, "B", g.b, g.trans_b ? g.n : g.k,
                                              g.trans_b ? g.k : g.n, g.batch);
    if (!a_ok || !b_ok || !check_range(kCall, "C", g.c, g.m, g.n, g.batch)) return;
    if (workspace != nullptr && !emu::rt::device_range(workspace, kNeedBytes)) {
      emu::rt::fail_sticky(cudaErrorIllegalAddress,
                           std::string(kCall) + ": the workspace is not device memory");
      return;
    }
    emu::blas::run(g);
    emu::blas::gemms_run.fetch_add(1);
  });
  // cuBLAS guide, cublasGemmEx: CUBLAS_STATUS_EXECUTION_FAILED, "the function failed to launch
  // on the GPU".
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
