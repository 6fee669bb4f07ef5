// CUDA GEMM: every call is one cublasGemmStridedBatchedEx. cuBLAS is column-major and our
// tensors row-major, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: the operands swap
// places and each keeps its own transpose flag. f32 runs in full f32 (no TF32, so the GPU
// tracks the CPU to 1e-5), f64 in f64, bf16 with f32 accumulation on the tensor cores, into a
// bf16 C or an f32 one (gradients summed over several calls).
#include <cublas_v2.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {
const char* cublas_status_name(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "alloc failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    default: return "error";
  }
}

int as_int(int64_t v, const char* what) {
  if (v > INT_MAX)
    throw std::invalid_argument(std::string("gemm: ") + what + " " + std::to_string(v) +
                                " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}
}  // namespace

void CudaBackend::gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& c) {
  if (g.batch == 0 || g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // an empty sum: C = 0, or unchanged when accumulating
    if (!g.accumulate) fill(c, 0.0);
    return;
  }
  const int m = as_int(g.m, "m"), n = as_int(g.n, "n"), k = as_int(g.k, "k");
  const int batch = as_int(g.batch, "batch");
  // Column-major view: first operand op(B)^T is n x k, second op(A)^T is k x m.
  const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_first = g.trans_b ? k : n;
  const int ld_second = g.trans_a ? m : k;

  cudaDataType_t type, c_type;
  cublasComputeType_t compute;
  float alpha32 = static_cast<float>(g.alpha), beta32 = g.accumulate ? 1.0f : 0.0f;
  double alpha64 = g.alpha, beta64 = g.accumulate ? 1.0 : 0.0;
  const void* alpha = &alpha32;
  const void* beta = &beta32;
  if (a.dtype() != b.dtype() ||
      (c.dtype() != a.dtype() && !(a.dtype() == DType::BF16 && c.dtype() == DType::F32)))
    throw std::invalid_argument(std::string("gemm: a ") + dtype_name(a.dtype()) + ", b " +
                                dtype_name(b.dtype()) + ", c " + dtype_name(c.dtype()) +
                                ": a and b share a dtype, and c has it too or is f32 for bf16");
  switch (a.dtype()) {
    case DType::F32: type = CUDA_R_32F; compute = CUBLAS_COMPUTE_32F; break;
    case DType::BF16: type = CUDA_R_16BF; compute = CUBLAS_COMPUTE_32F; break;
    case DType::F64:
      type = CUDA_R_64F;
      compute = CUBLAS_COMPUTE_64F;
      alpha = &alpha64;
      beta = &beta64;
      break;
    default: throw std::invalid_argument(std::string("gemm: no CUDA GEMM for ") +
                                         dtype_name(a.dtype()));
  }
  c_type = c.dtype() == a.dtype() ? type : CUDA_R_32F;  // bf16 inputs summed into f32
  const cublasStatus_t status = cublasGemmStridedBatchedEx(
      cublas_handle(), op_first, op_second, n, m, k, alpha, b.raw_data(), type, ld_first,
      g.stride_b, a.raw_data(), type, ld_second, g.stride_a, beta, c.raw_data(), c_type, n,
      g.stride_c, batch, compute, CUBLAS_GEMM_DEFAULT);
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("CUDA: cublasGemmStridedBatchedEx (" + std::to_string(g.batch) +
                             " x " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" +
                             std::to_string(g.k) + ", " + dtype_name(c.dtype()) +
                             ") failed: " + cublas_status_name(status));
}

}  // namespace mod::cuda
