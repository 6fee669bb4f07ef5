// GEMM through OpenBLAS, loaded with dlopen on first use so that modtrain, not the environment,
// picks the kernel: OPENBLAS_CORETYPE (which some images set to Haswell, halving the speed on
// AVX-512 CPUs) is removed before loading, so OpenBLAS selects by CPUID. MOD_OPENBLAS_CORETYPE
// forces a kernel on purpose. See docs/blas.md for why OpenBLAS.
#pragma once

#include <cstdint>
#include <string>

namespace mod::cpu {

// Row-major C = alpha * op(A) op(B) + beta * C with leading dimensions, as cblas_?gemm.
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
               int64_t ldc);

// "OpenBLAS 0.3.21 ... kernel Zen (OpenMP, 2 threads)"; loads the library if needed.
std::string blas_describe();

}  // namespace mod::cpu
