// Counters of the cuBLAS and cuBLASLt stand-ins (emulator/libs/), for tests: whether a GEMM ran
// through cuBLASLt or cuBLAS, and whether cuBLAS reached for its default workspace pool.
#pragma once

#include <cstdint>

namespace emu::blas {

// Workspaces the cuBLAS stand-in took from its default pool (emu::rt::device_malloc calls,
// failed ones included): 0 while every GEMM ran on a cublasSetWorkspace buffer.
int64_t default_pool_allocations();
// cublasGemmStridedBatchedEx calls that ran (a captured one counts each time its graph runs).
int64_t gemm_calls();
// cublasLtMatmul calls that ran, counted the same way.
int64_t lt_matmul_calls();

}  // namespace emu::blas
