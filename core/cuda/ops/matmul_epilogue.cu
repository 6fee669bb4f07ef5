// GEMMs with GELU in the epilogue, through cuBLASLt: GELU_AUX writes the product (the aux
// matrix) and its GELU, DGELU multiplies the product by GELU's derivative at the aux matrix.
// cuBLASLt's GELU is the tanh approximation, gelu_forward's. The row-major trick of matmul.cu
// applies: C^T = op(B)^T op(A)^T, so the aux matrix is C's own layout (ld = n).
//
// Where cuBLASLt cannot serve a call (f64, an aux leading dimension not a multiple of 8, a
// pointer off a 16-byte boundary, or no algorithm for the shape) the backend's default runs the
// GEMM and the GELU kernel instead. The algorithm is chosen per shape and per alignment of the
// pointers: the heuristic is told each operand's alignment (PREF_MIN_ALIGNMENT_*_BYTES, which
// cuBLASLt otherwise assumes to be 256), so the algorithm it returns takes the call, and a
// refusal disables only that (shape, alignment). epilogue_gemm_calls() counts the calls
// cuBLASLt ran, so tests can tell the epilogue from the fallback.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/device.h"
#include "core/cuda/stream.h"

namespace mod::cuda {

namespace {

void lt_check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("CUDA: ") + call + " failed: cuBLAS status " +
                             std::to_string(static_cast<int>(status)));
}

std::atomic<int64_t> lt_calls{0};

// The largest power of two up to 256 that divides p's address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

// One call's shape, types, epilogue and its four pointers' alignments: the key of the
// algorithm cache.
using LtKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, int, int, uint32_t, uint32_t,
                         uint32_t, uint32_t>;
struct LtChoice {
  bool supported = false;
  cublasLtMatmulAlgo_t algo{};
};

// Owns the descriptors of one call.
struct LtCall {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  ~LtCall() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// D = op(A) op(B) with `epilogue` reading or writing aux (row-major [M,N] like D); false when
// cuBLASLt has no algorithm for it (the caller falls back).
bool lt_gemm(const GemmArgs& g, const Tensor& a, const Tensor& b, const Tensor& aux, Tensor& d,
             cublasLtEpilogue_t epilogue) {
  if (g.batch != 1 || g.accumulate || g.alpha != 1.0) return false;
  if (a.dtype() != DType::F32 && a.dtype() != DType::BF16) return false;
  if (b.dtype() != a.dtype() || d.dtype() != a.dtype() || aux.dtype() != a.dtype()) return false;
  if (g.m > INT_MAX || g.n > INT_MAX || g.k > INT_MAX || g.n % 8 != 0) return false;
  // cuBLASLt's A is our op(B), its B our op(A), C and D ours; the aux matrix is d's shape.
  const uint32_t align_a = alignment(b.raw_data()), align_b = alignment(a.raw_data()),
                 align_d = alignment(d.raw_data()), align_aux = alignment(aux.raw_data());
  if (std::min({align_a, align_b, align_d, align_aux}) < 16) return false;
  const cudaDataType_t type = a.dtype() == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  const int64_t m = g.m, n = g.n, k = g.k;

  // The heuristic query costs host time, so each shape asks once; a shape known to be refused
  // returns before any descriptor is made.
  static std::mutex mutex;
  static std::map<LtKey, LtChoice> choices;
  const LtKey key{m, n, k, g.trans_a, g.trans_b, static_cast<int>(type),
                  static_cast<int>(epilogue), align_a, align_b, align_d, align_aux};
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = choices.find(key);
    if (it != choices.end() && !it->second.supported) return false;
  }

  LtCall call;
  lt_check(cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
           "cublasLtMatmulDescCreate");
  // Column-major: the first operand is op(B)^T (n x k), the second op(A)^T (k x m).
  const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const void* aux_ptr = aux.raw_data();
  const int64_t aux_ld = n;
  const cudaDataType_t aux_type = type;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    lt_check(cublasLtMatmulDescSetAttribute(call.desc, attr, value, size),
             "cublasLtMatmulDescSetAttribute");
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux_ptr, sizeof(aux_ptr));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
  set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type));
  lt_check(cublasLtMatrixLayoutCreate(&call.first, type, g.trans_b ? k : n, g.trans_b ? n : k,
                                      g.trans_b ? k : n),
           "cublasLtMatrixLayoutCreate");
  lt_check(cublasLtMatrixLayoutCreate(&call.second, type, g.trans_a ? m : k, g.trans_a ? k : m,
                                      g.trans_a ? m : k),
           "cublasLtMatrixLayoutCreate");
  lt_check(cublasLtMatrixLayoutCreate(&call.out, type, n, m, n), "cublasLtMatrixLayoutCreate");

  LtChoice choice;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = choices.find(key);
    if (it == choices.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      lt_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      const size_t workspace = kCublasLtWorkspaceBytes;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &workspace, sizeof(workspace));
      const uint32_t align_c = align_d;
      for (const auto& [attr, bytes] :
           {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a},
            std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b},
            std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c},
            std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d}})
        cublasLtMatmulPreferenceSetAttribute(pref, attr, bytes, sizeof(uint32_t));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
          cublaslt_handle(), call.desc, call.first, call.second, call.out, call.out, pref, 1,
          &result, &found);
      cublasLtMatmulPreferenceDestroy(pref);
      LtChoice made;
      made.supported = status == CUBLAS_STATUS_SUCCESS && found > 0;
      if (made.supported) made.algo = result.algo;
      it = choices.emplace(key, made).first;
    }
    choice = it->second;
  }
  if (!choice.supported) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status =
      cublasLtMatmul(cublaslt_handle(), call.desc, &alpha, b.raw_data(), call.first, a.raw_data(),
                     call.second, &beta, d.raw_data(), call.out, d.raw_data(), call.out,
                     &choice.algo, cublaslt_workspace(), kCublasLtWorkspaceBytes,
                     compute_stream());
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {  // the heuristic's algorithm refused the call
    std::lock_guard<std::mutex> lock(mutex);
    choices[key].supported = false;
    return false;
  }
  lt_check(status, "cublasLtMatmul");
  lt_calls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

int64_t epilogue_gemm_calls() { return lt_calls.load(std::memory_order_relaxed); }

void CudaBackend::gemm_gelu(const GemmArgs& g, const Tensor& a, const Tensor& b, Tensor& pre,
                            Tensor& out) {
  if (g.m == 0 || g.n == 0 || g.k == 0 || !lt_gemm(g, a, b, pre, out, CUBLASLT_EPILOGUE_GELU_AUX))
    Backend::gemm_gelu(g, a, b, pre, out);
}

void CudaBackend::gemm_dgelu(const GemmArgs& g, const Tensor& a, const Tensor& b,
                             const Tensor& pre, Tensor& out) {
  if (g.m == 0 || g.n == 0 || g.k == 0 || !lt_gemm(g, a, b, pre, out, CUBLASLT_EPILOGUE_DGELU))
    Backend::gemm_dgelu(g, a, b, pre, out);
}

}  // namespace mod::cuda
