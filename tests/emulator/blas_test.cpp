// The cuBLAS and cuBLASLt stand-ins (emulator/libs/) against a naive f64 reference: every type
// combination the backend uses on odd shapes, transposes, padded leading dimensions, batches,
// beta = 1 and beta = 0 over NaN; bf16 rounded once; the GELU epilogues; the statuses cuBLAS
// documents for bad arguments; the cuBLASLt heuristic's refusals; and the workspace rules
// (cublasSetStream resets to the default pool, which a captured GEMM cannot allocate from).
// Runs on tests/emulator/fake_runtime.cpp until the emulator's runtime lands.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "emu/blas_stats.h"
#include "emu/runtime.h"
#include "tests/emulator/fake_runtime.h"

namespace {

// A device buffer of n elements (256-byte aligned), optionally starting `offset` bytes in.
template <typename T>
struct Dev {
  void* base = nullptr;
  T* ptr = nullptr;
  size_t n = 0;
  explicit Dev(size_t count, size_t offset = 0) : n(count) {
    REQUIRE(emu::rt::device_malloc(&base, count * sizeof(T) + offset, "test") == cudaSuccess);
    ptr = reinterpret_cast<T*>(static_cast<char*>(base) + offset);
  }
  ~Dev() { emu::fake::device_free(base); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T& operator[](size_t i) { return ptr[i]; }
};

enum class Combo { kF32, kBF16, kBF16ToF32, kF64 };

double to_double(float v) {
  return v;
}
double to_double(double v) {
  return v;
}
double to_double(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
T from_double(double v);
template <>
float from_double<float>(double v) {
  return static_cast<float>(v);
}
template <>
double from_double<double>(double v) {
  return v;
}
template <>
__nv_bfloat16 from_double<__nv_bfloat16>(double v) {
  return __double2bfloat16(v);
}

template <typename T>
cudaDataType_t type_of();
template <>
cudaDataType_t type_of<float>() {
  return CUDA_R_32F;
}
template <>
cudaDataType_t type_of<double>() {
  return CUDA_R_64F;
}
template <>
cudaDataType_t type_of<__nv_bfloat16>() {
  return CUDA_R_16BF;
}

// Values exactly representable in bf16, so every input type holds the same numbers.
double random_value(std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return __bfloat162float(__float2bfloat16(u(rng)));
}

struct Case {
  int m, n, k, batch;
  bool ta, tb;
  double alpha, beta;
};

// C = alpha op(A) op(B) + beta C through cublasGemmStridedBatchedEx, checked element by element
// against f64, and C's padding rows checked untouched.
template <typename In, typename Out>
void check_gemm(cublasHandle_t h, const Case& c, std::mt19937& rng) {
  const int a_rows = c.ta ? c.k : c.m, a_cols = c.ta ? c.m : c.k;
  const int b_rows = c.tb ? c.n : c.k, b_cols = c.tb ? c.k : c.n;
  const int lda = a_rows + 3, ldb = b_rows + 5, ldc = c.m + 2;
  const long long sa = static_cast<long long>(lda) * a_cols + 7;
  const long long sb = static_cast<long long>(ldb) * b_cols + 1;
  const long long sc = static_cast<long long>(ldc) * c.n + 3;
  Dev<In> a(static_cast<size_t>(sa * c.batch)), b(static_cast<size_t>(sb * c.batch));
  Dev<Out> out(static_cast<size_t>(sc * c.batch));
  std::vector<double> av(a.n), bv(b.n), cv(out.n);
  for (size_t i = 0; i < a.n; ++i) a[i] = from_double<In>(av[i] = random_value(rng));
  for (size_t i = 0; i < b.n; ++i) b[i] = from_double<In>(bv[i] = random_value(rng));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < out.n; ++i) {
    cv[i] = c.beta == 0 ? nan : random_value(rng);
    out[i] = from_double<Out>(cv[i]);
  }
  const bool f64 = std::is_same_v<In, double>;
  const float alpha32 = static_cast<float>(c.alpha), beta32 = static_cast<float>(c.beta);
  const void* alpha = f64 ? static_cast<const void*>(&c.alpha) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&c.beta) : &beta32;
  const int64_t before = emu::blas::gemm_calls();
  REQUIRE(cublasGemmStridedBatchedEx(
              h, c.ta ? CUBLAS_OP_T : CUBLAS_OP_N, c.tb ? CUBLAS_OP_T : CUBLAS_OP_N, c.m, c.n, c.k,
              alpha, a.ptr, type_of<In>(), lda, sa, b.ptr, type_of<In>(), ldb, sb, beta, out.ptr,
              type_of<Out>(), ldc, sc, c.batch, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
              CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(emu::blas::gemm_calls() == before + 1);

  const double eps_acc = f64 ? 0x1p-52 : 0x1p-24;
  const double eps_out = std::is_same_v<Out, __nv_bfloat16> ? 0x1p-8 : eps_acc;
  for (int p = 0; p < c.batch; ++p) {
    for (int j = 0; j < c.n; ++j) {
      for (int i = 0; i < ldc; ++i) {
        const size_t ci = static_cast<size_t>(p * sc + i + static_cast<long long>(j) * ldc);
        const double got = to_double(out[ci]);
        if (i >= c.m) {  // padding: never written
          if (c.beta == 0)
            REQUIRE(std::isnan(got));
          else
            REQUIRE(got == to_double(from_double<Out>(cv[ci])));
          continue;
        }
        double ref = 0, mag = 0;
        for (int kk = 0; kk < c.k; ++kk) {
          const double x = av[static_cast<size_t>(p * sa + (c.ta ? kk + i * lda : i + kk * lda))];
          const double y = bv[static_cast<size_t>(p * sb + (c.tb ? j + kk * ldb : kk + j * ldb))];
          ref += x * y;
          mag += std::fabs(x * y);
        }
        ref = c.alpha * ref;
        mag = std::fabs(c.alpha) * mag;
        if (c.beta != 0) {
          ref += c.beta * cv[ci];
          mag += std::fabs(c.beta * cv[ci]);
        }
        INFO("m " << c.m << " n " << c.n << " k " << c.k << " batch " << p << " ta " << c.ta
                  << " tb " << c.tb << " beta " << c.beta << " at (" << i << ", " << j << ")");
        REQUIRE(std::isfinite(got));
        REQUIRE(std::fabs(got - ref) <= eps_out * std::fabs(ref) + 4 * (c.k + 2) * eps_acc * mag);
      }
    }
  }
}

struct Handle {
  cublasHandle_t h = nullptr;
  Handle() { REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS); }
  ~Handle() { cublasDestroy(h); }
};

template <typename In, typename Out>
void sweep(cublasHandle_t h) {
  std::mt19937 rng(7);
  for (int m : {1, 3, 17, 33})
    for (int n : {1, 3, 17, 33})
      for (int k : {1, 3, 17, 33})
        for (int batch : {1, 3})
          for (int t = 0; t < 4; ++t) {
            const bool ta = t & 1, tb = t & 2;
            check_gemm<In, Out>(h, {m, n, k, batch, ta, tb, 1.0, 0.0}, rng);
            check_gemm<In, Out>(h, {m, n, k, batch, ta, tb, 1.5, 1.0}, rng);
          }
}

}  // namespace

TEST_CASE("cublasGemmStridedBatchedEx matches f64 in every type combination", "[emulator]") {
  Handle h;
  Dev<char> workspace(1 << 20);
  REQUIRE(cublasSetWorkspace(h.h, workspace.ptr, 1 << 20) == CUBLAS_STATUS_SUCCESS);
  SECTION("f32") {
    sweep<float, float>(h.h);
  }
  SECTION("bf16 into bf16") {
    sweep<__nv_bfloat16, __nv_bfloat16>(h.h);
  }
  SECTION("bf16 into f32") {
    sweep<__nv_bfloat16, float>(h.h);
  }
  SECTION("f64") {
    sweep<double, double>(h.h);
  }
}

TEST_CASE("GEMM rounds once: f32 without TF32, bf16 from the f32 sum", "[emulator]") {
  Handle h;
  const float one = 1.0f, zero = 0.0f;
  SECTION("f32 keeps bits TF32 would drop") {
    Dev<float> a(1), b(1), c(1);
    a[0] = 1.0f + 0x1p-20f;
    b[0] = 1.0f;
    REQUIRE(cublasGemmStridedBatchedEx(h.h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.ptr,
                                       CUDA_R_32F, 1, 0, b.ptr, CUDA_R_32F, 1, 0, &zero, c.ptr,
                                       CUDA_R_32F, 1, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(c[0] == 1.0f + 0x1p-20f);
  }
  SECTION("bf16 sums exact in f32, each rounded to nearest even once") {
    // Column j of C is the sum of k = 301 products: 300 ones plus extra[j]. The f32 sums are
    // exact; a bf16 accumulator would stop at 256.
    const int k = 301;
    const double extra[] = {0, 1, -44, 3, -45, 0.5};
    const int n = 6;
    Dev<__nv_bfloat16> a(k), b(static_cast<size_t>(k * n)), c(n);
    for (int i = 0; i < k; ++i) a[i] = __float2bfloat16(1.0f);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < k; ++i)
        b[static_cast<size_t>(i + j * k)] = __double2bfloat16(i + 1 < k ? 1.0 : extra[j]);
    REQUIRE(cublasGemmStridedBatchedEx(h.h, CUBLAS_OP_N, CUBLAS_OP_N, 1, n, k, &one, a.ptr,
                                       CUDA_R_16BF, 1, 0, b.ptr, CUDA_R_16BF, k, 0, &zero, c.ptr,
                                       CUDA_R_16BF, 1, 0, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    for (int j = 0; j < n; ++j) {
      const double exact = 300 + extra[j];
      INFO("sum " << exact);
      uint16_t got, want;
      const __nv_bfloat16 ref = __double2bfloat16(exact);
      std::memcpy(&got, &c[static_cast<size_t>(j)], 2);
      std::memcpy(&want, &ref, 2);
      REQUIRE(got == want);
    }
    // bf16 steps by 2 in [256, 512): 301 ties to even 300, 303 to even 304, 300.5 is nearer 300.
    REQUIRE(__bfloat162float(c[0]) == 300.0f);
    REQUIRE(__bfloat162float(c[1]) == 300.0f);
    REQUIRE(__bfloat162float(c[3]) == 304.0f);
    REQUIRE(__bfloat162float(c[4]) == 255.0f);
    REQUIRE(__bfloat162float(c[5]) == 300.0f);
  }
}

TEST_CASE("cublasGemmStridedBatchedEx refuses bad arguments with cuBLAS's statuses", "[emulator]") {
  Handle h;
  Dev<float> a(64), b(64), c(64);
  const float one = 1.0f;
  auto gemm = [&](cublasHandle_t handle, cublasOperation_t ta, int m, int n, int k, int lda,
                  int ldb, int ldc, int batch, cudaDataType_t at, cudaDataType_t ct,
                  cublasComputeType_t compute, const float* B = nullptr) {
    return cublasGemmStridedBatchedEx(handle, ta, CUBLAS_OP_N, m, n, k, &one, a.ptr, at, lda, 0,
                                      B ? B : b.ptr, at, ldb, 0, &one, c.ptr, ct, ldc, 0, batch,
                                      compute, CUBLAS_GEMM_DEFAULT);
  };
  const auto f32 = CUDA_R_32F;
  const auto c32 = CUBLAS_COMPUTE_32F;
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, f32, c32) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(gemm(nullptr, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, f32, c32) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, -1, 4, 4, 4, 4, 4, 1, f32, f32, c32) ==
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, -1, 4, 4, 4, 4, 1, f32, f32, c32) ==
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, -1, 4, 4, 4, 1, f32, f32, c32) ==
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, -1, f32, f32, c32) ==
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 3, 4, 4, 1, f32, f32, c32) ==  // lda < m
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_T, 4, 4, 2, 2, 4, 4, 1, f32, f32, c32) ==  // lda = k: fine for T
          CUBLAS_STATUS_SUCCESS);
  REQUIRE(gemm(h.h, CUBLAS_OP_T, 4, 4, 2, 1, 4, 4, 1, f32, f32, c32) ==  // lda < k
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 3, 4, 1, f32, f32, c32) ==  // ldb < k
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 3, 1, f32, f32, c32) ==  // ldc < m
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 0, 4, 4, 0, 4, 0, 1, f32, f32, c32) ==  // ld >= max(1, 0)
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, static_cast<cublasOperation_t>(9), 4, 4, 4, 4, 4, 4, 1, f32, f32, c32) ==
          CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, CUDA_R_16BF, c32) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, CUDA_R_16F, CUDA_R_16F, c32) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, f32, CUBLAS_COMPUTE_32F_FAST_TF32) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
  REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, f32, CUBLAS_COMPUTE_64F) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
  REQUIRE(cublasSetWorkspace(h.h, a.ptr + 1, 16) ==
          CUBLAS_STATUS_INVALID_VALUE);  // not 256-aligned
  REQUIRE(cublasGetStream(h.h, nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  REQUIRE(cublasSetStream(nullptr, nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);

  SECTION("an operand outside device memory faults when the GEMM runs") {
    std::vector<float> host(64, 1.0f);
    const int64_t before = emu::blas::gemm_calls();
    REQUIRE(gemm(h.h, CUBLAS_OP_N, 4, 4, 4, 4, 4, 4, 1, f32, f32, c32, host.data()) ==
            CUBLAS_STATUS_SUCCESS);  // as on a GPU: the launch succeeds, the kernel faults
    CHECK(emu::blas::gemm_calls() == before);
    CHECK(emu::fake::sticky_code() == cudaErrorIllegalAddress);
    CHECK_THAT(emu::fake::sticky_message(),
               Catch::Contains("cublasGemmStridedBatchedEx") && Catch::Contains("operand B"));
    emu::fake::clear_sticky();
  }
}

namespace {

// One cuBLASLt call's descriptors, column-major D (m x n) = op(A) op(B) with an aux matrix.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Lt(cudaDataType_t type, int m, int n, int k, cublasLtEpilogue_t epilogue, const void* aux,
     int64_t aux_ld) {
    REQUIRE(cublasLtCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
            CUBLAS_STATUS_SUCCESS);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux));
    set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld));
    REQUIRE(cublasLtMatrixLayoutCreate(&a, type, m, k, m) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&b, type, k, n, k) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatrixLayoutCreate(&d, type, m, n, m) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
    const uint64_t workspace = 32u << 20;
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace,
                                                 sizeof(workspace)) == CUBLAS_STATUS_SUCCESS);
  }
  ~Lt() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
  }
  void set(cublasLtMatmulDescAttributes_t attr, const void* v, size_t size) {
    REQUIRE(cublasLtMatmulDescSetAttribute(desc, attr, v, size) == CUBLAS_STATUS_SUCCESS);
  }
  void align(uint32_t bytes) {
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes)) ==
              CUBLAS_STATUS_SUCCESS);
  }
  // The heuristic's status; its one algorithm in *out.
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t* out, int* found) {
    return cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, pref, 1, out, found);
  }
  cublasStatus_t run(const cublasLtMatmulAlgo_t* algo, const void* A, const void* B, void* D,
                     void* workspace, size_t workspace_bytes) {
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(handle, desc, &one, A, a, B, b, &zero, D, d, D, d, algo, workspace,
                          workspace_bytes, nullptr);
  }
};

template <typename T>
void check_epilogue(cublasLtEpilogue_t epilogue) {
  const int m = 17, n = 9, k = 33, ld_aux = 24;
  std::mt19937 rng(3);
  Dev<T> a(m * k), b(k * n), d(m * n), aux(ld_aux * n);
  std::vector<double> av(a.n), bv(b.n), pre(aux.n);
  for (size_t i = 0; i < a.n; ++i) a[i] = from_double<T>(av[i] = random_value(rng));
  for (size_t i = 0; i < b.n; ++i) b[i] = from_double<T>(bv[i] = random_value(rng));
  for (size_t i = 0; i < aux.n; ++i) {  // DGELU's input
    aux[i] = from_double<T>(3 * random_value(rng));
    pre[i] = to_double(aux[i]);
  }
  for (size_t i = 0; i < d.n; ++i) d[i] = from_double<T>(std::nan(""));
  Lt lt(type_of<T>(), m, n, k, epilogue, aux.ptr, ld_aux);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  REQUIRE(lt.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(found == 1);
  const int64_t before = emu::blas::lt_matmul_calls();
  REQUIRE(lt.run(&result.algo, a.ptr, b.ptr, d.ptr, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(emu::blas::lt_matmul_calls() == before + 1);
  const double c0 = 0.7978845608028654, c1 = 0.044715;
  const double eps_out = std::is_same_v<T, float> ? 0x1p-24 : 0x1p-8;
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double p = 0, mag = 0;
      for (int kk = 0; kk < k; ++kk) {
        p += av[static_cast<size_t>(i + kk * m)] * bv[static_cast<size_t>(kk + j * k)];
        mag += std::fabs(av[static_cast<size_t>(i + kk * m)] * bv[static_cast<size_t>(kk + j * k)]);
      }
      const size_t x = static_cast<size_t>(i + j * ld_aux);
      double want;
      if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX) {
        const double gelu = 0.5 * p * (1 + std::tanh(c0 * (p + c1 * p * p * p)));
        want = gelu;
        REQUIRE(std::fabs(to_double(aux[x]) - p) <= eps_out * std::fabs(p) + 64 * 0x1p-24 * mag);
      } else {
        const double v = pre[x], t = std::tanh(c0 * (v + c1 * v * v * v));
        const double grad = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c0 * (1 + 3 * c1 * v * v);
        want = p * grad;
        mag *= std::fabs(grad);
        REQUIRE(to_double(aux[x]) == pre[x]);  // an input, untouched
      }
      INFO("(" << i << ", " << j << ") product " << p);
      REQUIRE(std::fabs(to_double(d[static_cast<size_t>(i + j * m)]) - want) <=
              eps_out * std::fabs(want) + 64 * 0x1p-24 * (mag + 1e-30));
    }
  }
}

}  // namespace

TEST_CASE("cublasLtMatmul's GELU_AUX and DGELU epilogues match f64", "[emulator]") {
  SECTION("GELU_AUX f32") {
    check_epilogue<float>(CUBLASLT_EPILOGUE_GELU_AUX);
  }
  SECTION("GELU_AUX bf16") {
    check_epilogue<__nv_bfloat16>(CUBLASLT_EPILOGUE_GELU_AUX);
  }
  SECTION("DGELU f32") {
    check_epilogue<float>(CUBLASLT_EPILOGUE_DGELU);
  }
  SECTION("DGELU bf16") {
    check_epilogue<__nv_bfloat16>(CUBLASLT_EPILOGUE_DGELU);
  }
}

TEST_CASE("the cuBLASLt heuristic's algorithm holds to the alignment and workspace it assumed",
          "[emulator]") {
  const int m = 8, n = 8, k = 8;
  Dev<float> a(m * k + 64, 4), b(k * n), d(m * n + 64, 16), aux(m * n);
  std::vector<float> zeros(m * k + 64, 0.0f);
  std::memcpy(a.ptr, zeros.data(), zeros.size() * sizeof(float));
  std::memcpy(b.ptr, zeros.data(), b.n * sizeof(float));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;

  SECTION("default preference: 256-byte alignment assumed, a 4-byte-aligned A is refused") {
    Lt lt(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_DEFAULT, nullptr, 0);
    REQUIRE(lt.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(found == 1);
    const int64_t before = emu::blas::lt_matmul_calls();
    d[0] = 42.0f;
    Dev<float> d256(m * n);
    CHECK(lt.run(&result.algo, a.ptr, b.ptr, d256.ptr, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(lt.run(&result.algo, b.ptr, b.ptr, d.ptr, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(lt.run(nullptr, a.ptr, b.ptr, d256.ptr, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(emu::blas::lt_matmul_calls() == before);
    CHECK(d[0] == 42.0f);  // no silent run
    CHECK(lt.run(&result.algo, b.ptr, b.ptr, d256.ptr, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
  }
  SECTION("16-byte preference: 16-byte pointers run, 4-byte ones do not") {
    Lt lt(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_DEFAULT, nullptr, 0);
    lt.align(16);
    REQUIRE(lt.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
    const int64_t before = emu::blas::lt_matmul_calls();
    CHECK(lt.run(&result.algo, b.ptr, b.ptr, d.ptr, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    CHECK(emu::blas::lt_matmul_calls() == before + 1);
    CHECK(lt.run(&result.algo, a.ptr, b.ptr, d.ptr, nullptr, 0) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("aux leading dimension not a multiple of 8: no algorithm") {
    Lt lt(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_GELU_AUX, aux.ptr, 12);
    found = 5;
    CHECK(lt.heuristic(&result, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
    Lt ok(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_GELU_AUX, aux.ptr, 8);
    CHECK(ok.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
    CHECK(found == 1);
  }
  SECTION("an epilogue the stand-in lacks: no algorithm") {
    Lt lt(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_RELU, nullptr, 0);
    CHECK(lt.heuristic(&result, &found) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(found == 0);
  }
  SECTION("descriptor attributes of the wrong size are refused") {
    Lt lt(CUDA_R_32F, m, n, k, CUBLASLT_EPILOGUE_DEFAULT, nullptr, 0);
    const int64_t wide = 1;
    CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide,
                                         sizeof(wide)) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
    int zero_count = 0;
    CHECK(cublasLtMatmulAlgoGetHeuristic(lt.handle, lt.desc, lt.a, lt.b, lt.d, lt.d, lt.pref, 0,
                                         &result, &zero_count) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("a large shape's algorithm wants workspace; less is INVALID_VALUE") {
    const int big = 128, kb = 64;  // m n k = 2^20
    Dev<float> x(big * kb), y(kb * big), z(big * big), workspace(1 << 18);
    std::memset(x.ptr, 0, x.n * sizeof(float));
    std::memset(y.ptr, 0, y.n * sizeof(float));
    Lt lt(CUDA_R_32F, big, big, kb, CUBLASLT_EPILOGUE_DEFAULT, nullptr, 0);
    REQUIRE(lt.heuristic(&result, &found) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(result.workspaceSize > 0);
    CHECK(lt.run(&result.algo, x.ptr, y.ptr, z.ptr, nullptr, 0) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(lt.run(&result.algo, x.ptr, y.ptr, z.ptr, workspace.ptr, 1 << 20) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(z[0] == 0.0f);
  }
}

namespace {
// One f32 GEMM [m, k] x [k, n] with batch `batch` on h's stream; inputs zero.
cublasStatus_t gemm_on(cublasHandle_t h, int m, int n, int k, int batch) {
  static Dev<float> a(1 << 20), b(1 << 20), c(1 << 20);
  const float one = 1.0f, zero = 0.0f;
  return cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.ptr, CUDA_R_32F,
                                    m, 0, b.ptr, CUDA_R_32F, k, 0, &zero, c.ptr, CUDA_R_32F, m, 0,
                                    batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
}  // namespace

TEST_CASE("cuBLAS's workspace: a user workspace until cublasSetStream resets to the default pool",
          "[emulator]") {
  Handle h;
  const auto s1 = reinterpret_cast<cudaStream_t>(0x10), s2 = reinterpret_cast<cudaStream_t>(0x20);
  Dev<char> workspace(1 << 20);
  const int64_t start = emu::blas::default_pool_allocations();
  auto allocations = [&] { return emu::blas::default_pool_allocations() - start; };
  REQUIRE(cublasSetStream(h.h, s1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasSetWorkspace(h.h, workspace.ptr, 1 << 20) == CUBLAS_STATUS_SUCCESS);

  // Needing workspace: m n k >= 2^20, or batch > 1.
  REQUIRE(gemm_on(h.h, 128, 128, 64, 1) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(gemm_on(h.h, 4, 4, 4, 2) == CUBLAS_STATUS_SUCCESS);
  CHECK(allocations() == 0);

  SECTION("cublasSetStream drops the user workspace: the default pool, once per stream") {
    REQUIRE(cublasSetStream(h.h, s1) == CUBLAS_STATUS_SUCCESS);  // the same stream resets too
    REQUIRE(gemm_on(h.h, 4, 4, 4, 1) == CUBLAS_STATUS_SUCCESS);  // needs none
    CHECK(allocations() == 0);
    REQUIRE(gemm_on(h.h, 128, 128, 64, 1) == CUBLAS_STATUS_SUCCESS);
    CHECK(allocations() == 1);
    REQUIRE(gemm_on(h.h, 4, 4, 4, 3) == CUBLAS_STATUS_SUCCESS);
    CHECK(allocations() == 1);
    REQUIRE(cublasSetStream(h.h, s2) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(gemm_on(h.h, 4, 4, 4, 3) == CUBLAS_STATUS_SUCCESS);
    CHECK(allocations() == 2);
  }
  SECTION("captured on the default pool: the allocation fails, even with a warm pool") {
    REQUIRE(cublasSetStream(h.h, s1) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(gemm_on(h.h, 4, 4, 4, 2) == CUBLAS_STATUS_SUCCESS);  // warms s1's pool
    const int64_t warm = allocations(), ran = emu::blas::gemm_calls();
    emu::fake::set_capturing(true);
    CHECK(gemm_on(h.h, 4, 4, 4, 2) == CUBLAS_STATUS_ALLOC_FAILED);
    CHECK(gemm_on(h.h, 4, 4, 4, 1) == CUBLAS_STATUS_SUCCESS);  // needs none
    CHECK(allocations() == warm + 1);
    // stream.cu's bind_cublas: cublasSetStream, then cublasSetWorkspace again.
    REQUIRE(cublasSetWorkspace(h.h, workspace.ptr, 1 << 20) == CUBLAS_STATUS_SUCCESS);
    CHECK(gemm_on(h.h, 4, 4, 4, 2) == CUBLAS_STATUS_SUCCESS);
    CHECK(allocations() == warm + 1);
    emu::fake::set_capturing(false);
    CHECK(emu::fake::recorded() == 2);
    CHECK(emu::blas::gemm_calls() == ran);
    emu::fake::replay();
    CHECK(emu::blas::gemm_calls() == ran + 2);
  }
  SECTION("a user workspace under 16 KiB fails the GEMM and never reaches the default pool") {
    REQUIRE(cublasSetWorkspace(h.h, workspace.ptr, 8 << 10) == CUBLAS_STATUS_SUCCESS);
    CHECK(gemm_on(h.h, 4, 4, 4, 2) == CUBLAS_STATUS_ALLOC_FAILED);
    CHECK(gemm_on(h.h, 4, 4, 4, 1) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetWorkspace(h.h, nullptr, 0) == CUBLAS_STATUS_SUCCESS);
    CHECK(gemm_on(h.h, 128, 128, 64, 1) == CUBLAS_STATUS_ALLOC_FAILED);
    CHECK(allocations() == 0);
  }
}

TEST_CASE("the stand-in GEMM runs a GPT-2 MLP shape in well under a second", "[emulator]") {
  // [64, 768] x [768, 3072] row-major, as matmul.cu issues it: C^T (3072 x 64) = B^T A^T.
  const int m = 64, k = 768, n = 3072;
  Handle h;
  Dev<char> workspace(1 << 20);
  REQUIRE(cublasSetWorkspace(h.h, workspace.ptr, 1 << 20) == CUBLAS_STATUS_SUCCESS);
  Dev<float> a(m * k), b(k * n), c(m * n);
  for (int i = 0; i < m * k; ++i) a[static_cast<size_t>(i)] = static_cast<float>(i % 7) - 3;
  for (int i = 0; i < k * n; ++i) b[static_cast<size_t>(i)] = static_cast<float>(i % 5) - 2;
  const float one = 1.0f, zero = 0.0f;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(cublasGemmStridedBatchedEx(h.h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &one, b.ptr,
                                     CUDA_R_32F, n, 0, a.ptr, CUDA_R_32F, k, 0, &zero, c.ptr,
                                     CUDA_R_32F, n, 0, 1, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  WARN("[64,768]x[768,3072] f32: " << seconds << " s");
  for (int i : {0, 17, 63})
    for (int j : {0, 1000, 3071}) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk)
        ref += double(a[static_cast<size_t>(i * k + kk)]) * b[static_cast<size_t>(kk * n + j)];
      REQUIRE(c[static_cast<size_t>(i * n + j)] == ref);  // small integers: exact in f32
    }
}
