// What the cuBLAS and cuBLASLt stand-ins share: the toolkit's data types mapped to gemm.h's,
// the operand range check each queued GEMM makes before it runs, and the counters behind
// emulator/include/emu/blas_stats.h.
#pragma once

#include <library_types.h>

#include <atomic>
#include <cstdint>

#include "gemm.h"

namespace emu::blas {

// False for a type the stand-ins do not compute in.
bool to_type(cudaDataType_t t, Type* out);

// Whether a rows x cols operand of `batch` matrices lies in one device allocation; if not, the
// process's sticky error becomes cudaErrorIllegalAddress with a message naming `call` and
// `operand`, as a GPU's faulting kernel would make it.
bool check_range(const char* call, const char* operand, const Matrix& x, int64_t rows, int64_t cols,
                 int64_t batch);

extern std::atomic<int64_t> pool_allocations, gemms_run, lt_matmuls_run;

}  // namespace emu::blas
