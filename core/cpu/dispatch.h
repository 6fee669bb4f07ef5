// Dtype dispatch and parallel thresholds for CPU kernels. Kernels are templates over the float
// type T (float, double) and, where they take indices, the index type I (int32_t, int64_t).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/tensor.h"

namespace mod::cpu {

// Below this many elements an OpenMP region costs more than it saves.
inline constexpr int64_t kParallelElements = 1 << 15;

template <typename F>
void dispatch_float(DType t, const char* kernel, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default:
      throw std::invalid_argument(std::string(kernel) + ": CPU kernel has no " + dtype_name(t) +
                                  " version (f32 and f64 only)");
  }
}

template <typename F>
void dispatch_index(DType t, const char* kernel, F&& f) {
  switch (t) {
    case DType::I32: f(int32_t{}); return;
    case DType::I64: f(int64_t{}); return;
    default:
      throw std::invalid_argument(std::string(kernel) + ": indices must be i32 or i64, got " +
                                  dtype_name(t));
  }
}

}  // namespace mod::cpu
