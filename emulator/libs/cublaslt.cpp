// The cuBLASLt stand-in: descriptors, preferences, the heuristic and cublasLtMatmul with the
// DEFAULT, GELU_AUX and DGELU epilogues, defined under the toolkit's cublasLt.h so that
// core/cuda/ops/matmul_epilogue.cu links against it unchanged. Single matrices (no batch
// layout attributes); f32, and bf16 into bf16 or f32, with f32 compute and scale.
//
// Heuristic and algorithm, the stand-in's model of what cublasLt.h and the cuBLAS guide
// ("cuBLASLt API Reference") document:
// - The preference's minimum alignments of A, B, C and D default to 256 bytes
//   (cublasLtMatmulPreferenceAttributes_t, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES: "Selecting
//   a smaller value will exclude algorithms that can not work with matrix A that is not as
//   strictly aligned as they need"); the aux matrix's expected alignment is taken from the aux
//   pointer's value (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: the heuristic "depend[s] on its
//   value to determine expected pointer alignment"). The returned algorithm records them, and
//   cublasLtMatmul on a pointer less aligned than that returns CUBLAS_STATUS_NOT_SUPPORTED
//   ("current implementation ... doesn't support configured operation"), never a silent run.
// - GELU_AUX and DGELU need an aux leading dimension divisible by 8 and no less than D's rows
//   (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD); otherwise, like any configuration the stand-in
//   does not serve, the heuristic returns CUBLAS_STATUS_NOT_SUPPORTED and no algorithm.
// - Workspace: for m n k >= 2^20 the algorithm wants kLtNeedBytes when the preference's
//   MAX_WORKSPACE_BYTES (default 0, "no workspace allowed") admits it, else 0 (the stand-in's
//   rule). cublasLtMatmul with less workspace than the algorithm needs returns
//   CUBLAS_STATUS_INVALID_VALUE (cublasLtMatmul: "when workspaceSizeInBytes is less than
//   workspace required by configured algo").
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "common.h"
#include "emu/runtime.h"
#include "gemm.h"

struct cublasLtContext {};

namespace {

constexpr size_t kLtNeedBytes = 1 << 20;
constexpr uint64_t kAlgoMagic = 0x656d752d6c74616cull;  // marks an algorithm the stand-in made

struct Desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* aux = nullptr;
  int64_t aux_ld = 0;
  int32_t aux_type = -1;  // -1: D's type (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE)
};

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

struct Pref {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};

Desc* as_desc(cublasLtMatmulDesc_t d) {
  return reinterpret_cast<Desc*>(d);
}
Layout* as_layout(cublasLtMatrixLayout_t l) {
  return reinterpret_cast<Layout*>(l);
}
Pref* as_pref(cublasLtMatmulPreference_t p) {
  return reinterpret_cast<Pref*>(p);
}

// The largest power of two up to 256 dividing p's address.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

// What the stand-in's algorithm records (cublasLtMatmulAlgo_t's eight words).
struct Algo {
  uint32_t align[5];  // A, B, C, D, aux
  uint64_t workspace;
};

cublasLtMatmulAlgo_t encode(const Algo& a) {
  cublasLtMatmulAlgo_t out{};
  out.data[0] = kAlgoMagic;
  for (int i = 0; i < 5; ++i) out.data[1 + i] = a.align[i];
  out.data[6] = a.workspace;
  return out;
}

bool decode(const cublasLtMatmulAlgo_t& in, Algo* a) {
  if (in.data[0] != kAlgoMagic) return false;
  for (int i = 0; i < 5; ++i) a->align[i] = static_cast<uint32_t>(in.data[1 + i]);
  a->workspace = in.data[6];
  return true;
}

bool uses_aux(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_DGELU;
}

// The GEMM a descriptor and four layouts describe (pointers not yet set), or the status that
// refuses it: NOT_SUPPORTED for what the stand-in does not compute, INVALID_VALUE for layouts
// in conflict (cublasLtMatmul: "parameters are in conflict or in an impossible configuration").
cublasStatus_t describe(const Desc& desc, const Layout& a, const Layout& b, const Layout& c,
                        const Layout& d, emu::blas::Gemm* g) {
  using emu::blas::Type;
  const bool f32_compute =
      desc.compute == CUBLAS_COMPUTE_32F || desc.compute == CUBLAS_COMPUTE_32F_PEDANTIC;
  if (!f32_compute || desc.scale != CUDA_R_32F || a.type != b.type || c.type != d.type)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!(a.type == CUDA_R_32F && d.type == CUDA_R_32F) &&
      !(a.type == CUDA_R_16BF && (d.type == CUDA_R_16BF || d.type == CUDA_R_32F)))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto op_ok = [](int32_t op) {
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
  };
  if (!op_ok(desc.transa) || !op_ok(desc.transb)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = desc.transa != CUBLAS_OP_N, tb = desc.transb != CUBLAS_OP_N;
  const auto m = static_cast<int64_t>(ta ? a.cols : a.rows);
  const auto k = static_cast<int64_t>(ta ? a.rows : a.cols);
  const auto kb = static_cast<int64_t>(tb ? b.cols : b.rows);
  const auto n = static_cast<int64_t>(tb ? b.rows : b.cols);
  if (k != kb || static_cast<int64_t>(d.rows) != m || static_cast<int64_t>(d.cols) != n ||
      c.rows != d.rows || c.cols != d.cols)
    return CUBLAS_STATUS_INVALID_VALUE;
  for (const Layout* l : {&a, &b, &c, &d})
    if (l->ld < std::max<int64_t>(1, static_cast<int64_t>(l->rows)))
      return CUBLAS_STATUS_INVALID_VALUE;

  g->m = m;
  g->n = n;
  g->k = k;
  g->trans_a = ta;
  g->trans_b = tb;
  emu::blas::to_type(a.type, &g->a.type);
  emu::blas::to_type(b.type, &g->b.type);
  emu::blas::to_type(c.type, &g->c.type);
  emu::blas::to_type(d.type, &g->d.type);
  g->a.ld = a.ld;
  g->b.ld = b.ld;
  g->c.ld = c.ld;
  g->d.ld = d.ld;
  switch (desc.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      g->epilogue = emu::blas::Epilogue::kNone;
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_EPILOGUE_GELU_AUX:
      g->epilogue = emu::blas::Epilogue::kGeluAux;
      break;
    case CUBLASLT_EPILOGUE_DGELU:
      g->epilogue = emu::blas::Epilogue::kDGelu;
      break;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: "Must be divisible by 8 and be no less than the
  // number of rows in the output matrix"; the aux type is D's unless set.
  if (desc.aux == nullptr || desc.aux_ld % 8 != 0 || desc.aux_ld < m)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const auto aux_type = desc.aux_type == -1 ? d.type : static_cast<cudaDataType_t>(desc.aux_type);
  if (aux_type != d.type) return CUBLAS_STATUS_NOT_SUPPORTED;
  emu::blas::to_type(aux_type, &g->aux.type);
  g->aux.ld = desc.aux_ld;
  g->aux.ptr = desc.aux;
  return CUBLAS_STATUS_SUCCESS;
}

// The algorithm the heuristic picks for a described GEMM under `pref`.
Algo choose(const emu::blas::Gemm& g, const Pref& pref) {
  Algo a{};
  for (int i = 0; i < 4; ++i) a.align[i] = pref.align[i];
  a.align[4] = g.epilogue == emu::blas::Epilogue::kNone ? 1 : alignment(g.aux.ptr);
  const bool large = g.m * g.n * g.k >= (int64_t{1} << 20);
  a.workspace = large && pref.max_workspace >= kLtNeedBytes ? kLtNeedBytes : 0;
  return a;
}

template <typename T>
cublasStatus_t set_value(T* field, const void* buf, size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* d = new Desc;
  d->compute = compute;
  d->scale = scale;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete as_desc(desc);
  return CUBLAS_STATUS_SUCCESS;
}

// cublasLtMatmulDescSetAttribute: INVALID_VALUE "if buf is NULL or sizeInBytes doesn't match
// size of internal storage for selected attribute". Attributes the stand-in would ignore are
// refused with INVALID_VALUE too, so none is silently dropped.
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Desc* d = as_desc(desc);
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_value(&d->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_value(&d->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_value(&d->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return set_value(&d->aux, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return set_value(&d->aux_ld, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      return set_value(&d->aux_type, buf, size);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete as_layout(layout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete as_pref(pref);
  return CUBLAS_STATUS_SUCCESS;
}

// Same contract as cublasLtMatmulDescSetAttribute (cublasLtMatmulPreferenceSetAttribute).
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Pref* p = as_pref(pref);
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_value(&p->max_workspace, buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_value(&p->align[0], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_value(&p->align[1], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_value(&p->align[2], buf, size);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_value(&p->align[3], buf, size);
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}

// cublasLtMatmulAlgoGetHeuristic: INVALID_VALUE "if requestedAlgoCount is less or equal to
// zero", NOT_SUPPORTED "if no heuristic function available for current configuration". The
// stand-in returns at most one algorithm.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested <= 0 || results == nullptr || returned == nullptr)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  if (!desc || !a || !b || !c || !d || !pref) return CUBLAS_STATUS_INVALID_VALUE;
  emu::blas::Gemm g;
  if (describe(*as_desc(desc), *as_layout(a), *as_layout(b), *as_layout(c), *as_layout(d), &g) !=
      CUBLAS_STATUS_SUCCESS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  const Algo algo = choose(g, *as_pref(pref));
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].algo = encode(algo);
  results[0].workspaceSize = algo.workspace;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

// D = epilogue(alpha op(A) op(B) + beta C), queued on `stream`. A null algo runs the heuristic
// with default preferences (cublasLtMatmul: "an implicit heuristics query with default search
// preferences will be performed").
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_layout, const void* B,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  static constexpr const char* kCall = "cublasLtMatmul";
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a_layout || !b_layout || !c_layout || !d_layout || !alpha || !beta)
    return CUBLAS_STATUS_INVALID_VALUE;
  emu::blas::Gemm g;
  const cublasStatus_t s = describe(*as_desc(desc), *as_layout(a_layout), *as_layout(b_layout),
                                    *as_layout(c_layout), *as_layout(d_layout), &g);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  Algo chosen{};
  if (algo == nullptr)
    chosen = choose(g, Pref{});
  else if (!decode(*algo, &chosen))
    return CUBLAS_STATUS_INVALID_VALUE;
  g.alpha = *static_cast<const float*>(alpha);  // scale type f32, pointer mode host
  g.beta = *static_cast<const float*>(beta);
  if (D == nullptr || (C == nullptr && g.beta != 0)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool aux = g.epilogue != emu::blas::Epilogue::kNone;
  if (alignment(A) < chosen.align[0] || alignment(B) < chosen.align[1] ||
      (C != nullptr && alignment(C) < chosen.align[2]) || alignment(D) < chosen.align[3] ||
      (aux && alignment(g.aux.ptr) < chosen.align[4]))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (workspace_bytes < chosen.workspace || (chosen.workspace > 0 && workspace == nullptr))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  g.a.ptr = A;
  g.b.ptr = B;
  g.c.ptr = C;
  g.d.ptr = D;
  const size_t need = chosen.workspace;

  const cudaError_t e = emu::rt::enqueue(stream, kCall, [g, workspace, need] {
    using emu::blas::check_range;
    bool ok = g.k == 0 ||
              (check_range(kCall, "A", g.a, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, 1) &&
               check_range(kCall, "B", g.b, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, 1));
    ok =
        ok && (g.beta == 0 || check_range(kCall, "C", g.c, g.m, g.n, 1)) &&
        check_range(kCall, "D", g.d, g.m, g.n, 1) &&
        (g.epilogue == emu::blas::Epilogue::kNone || check_range(kCall, "aux", g.aux, g.m, g.n, 1));
    if (ok && need > 0 && !emu::rt::device_range(workspace, need)) {
      emu::rt::fail_sticky(cudaErrorIllegalAddress,
                           std::string(kCall) + ": the workspace is not device memory");
      ok = false;
    }
    if (!ok) return;
    emu::blas::run(g);
    emu::blas::lt_matmuls_run.fetch_add(1);
  });
  // As cublasLtMatmul's EXECUTION_FAILED: "cuda reported execution error from the device".
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
