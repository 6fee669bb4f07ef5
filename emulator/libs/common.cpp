// The stand-ins' shared helpers (common.h) and counters (emulator/include/emu/blas_stats.h).
#include "common.h"

#include <algorithm>
#include <string>

#include "emu/blas_stats.h"
#include "emu/runtime.h"

namespace emu::blas {

std::atomic<int64_t> pool_allocations{0}, gemms_run{0}, lt_matmuls_run{0};

int64_t default_pool_allocations() {
  return pool_allocations.load();
}
int64_t gemm_calls() {
  return gemms_run.load();
}
int64_t lt_matmul_calls() {
  return lt_matmuls_run.load();
}

bool to_type(cudaDataType_t t, Type* out) {
  switch (t) {
    case CUDA_R_32F:
      *out = Type::kF32;
      return true;
    case CUDA_R_64F:
      *out = Type::kF64;
      return true;
    case CUDA_R_16BF:
      *out = Type::kBF16;
      return true;
    default:
      return false;
  }
}

bool check_range(const char* call, const char* operand, const Matrix& x, int64_t rows, int64_t cols,
                 int64_t batch) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return true;
  // Element offsets from the lowest batch's first element to the highest batch's last.
  const int64_t last_batch = (batch - 1) * x.stride;
  const int64_t lo = std::min<int64_t>(0, last_batch);
  const int64_t hi = std::max<int64_t>(0, last_batch) + (rows - 1) + (cols - 1) * x.ld;
  const size_t elem = type_bytes(x.type);
  const char* start = static_cast<const char*>(x.ptr) + lo * static_cast<int64_t>(elem);
  const size_t bytes = static_cast<size_t>(hi - lo + 1) * elem;
  if (x.ptr != nullptr && rt::device_range(start, bytes)) return true;
  rt::fail_sticky(cudaErrorIllegalAddress,
                  std::string(call) + ": operand " + operand + " (" + std::to_string(rows) + " x " +
                      std::to_string(cols) + ", ld " + std::to_string(x.ld) + ", " +
                      std::to_string(batch) + " batch(es)) is not inside one device allocation");
  return false;
}

}  // namespace emu::blas
