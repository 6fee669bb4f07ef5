// GEMM for the CPU backend. f32 products run in oneDNN where the build has it (its SGEMM beats
// OpenBLAS's on this project's shapes on AVX-512 CPUs and ties on AVX2 ones, and it applies
// beta = 0 without a pass of its own; docs/blas.md), else in OpenBLAS; f64 products always run
// in OpenBLAS. oneDNN 2.6 halves its rate on A^T B (the weight gradient) once a side of C
// reaches 512, so those go to OpenBLAS too; its AVX-512 kernels run x W^T with a narrow output
// slowly, so those run on a transposed copy of W, and a narrow layer's weight gradient over many
// tokens as C^T split along K between the threads. MOD_SGEMM=openblas|onednn picks the f32
// library on purpose.
//
// OpenBLAS is loaded with dlopen on first use so that modtrain, not the environment, picks its
// kernel: OPENBLAS_CORETYPE (which some images set to Haswell, halving the speed on AVX-512
// CPUs) is removed before loading, so OpenBLAS selects by CPUID. MOD_OPENBLAS_CORETYPE forces a
// kernel on purpose.
#pragma once

#include <cstdint>
#include <string>

namespace mod::cpu {

// Row-major C = alpha * op(A) op(B) + beta * C with leading dimensions, as cblas_?gemm. One-row
// and one-column products (decoding) run in loops of our own; see blas.cpp.
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc);
void blas_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
               int64_t ldc);

enum class SgemmLibrary { OpenBlas, OneDnn };

// The library f32 GEMMs use now: MOD_SGEMM when set (an unknown value throws, naming it), else
// oneDNN when built in, else OpenBLAS.
SgemmLibrary sgemm_library();
// Benchmarks and tests compare the two in one process; throws when the build lacks oneDNN.
void set_sgemm_library(SgemmLibrary library);

// How blas_gemm runs an f32 product of this layout and shape now, at the current OpenMP thread
// count: "own loop" (one row or column), "oneDNN", "oneDNN, B transposed first", "oneDNN, K split
// between the threads" or "OpenBLAS" (blas_test checks the routing).
std::string sgemm_path(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k);

// "f32 oneDNN 2.6.3 (avx512_core_amx); f64 OpenBLAS 0.3.21 ..., kernel SkylakeX, 2 threads";
// loads OpenBLAS if needed.
std::string blas_describe();

}  // namespace mod::cpu
