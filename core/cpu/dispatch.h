// Dtype dispatch and parallel thresholds for CPU kernels. Kernels are templates over the float
// type T (float, double) and, where they take indices, the index type I (int32_t, int64_t,
// through mod::dispatch_index). The cases themselves live in core/dtype_dispatch.h.
#pragma once

#include <cstdint>

#include "core/cpu/op_trace.h"
#include "core/dtype_dispatch.h"
#include "core/tensor.h"

namespace mod::cpu {

// Below this many elements an OpenMP region costs more than it saves.
inline constexpr int64_t kParallelElements = 1 << 15;

// Calls f(T{}) for the tensor's float dtype: f32 or f64 (no bf16 CPU kernels). Every CPU op
// comes through here, so here is where a running op trace times it (op_trace.h).
template <typename F>
void dispatch_float(DType t, const char* kernel, F&& f) {
  OpTraceScope trace(kernel);
  dispatch_dtype<F32Case, F64Case>(t, kernel, "CPU kernel takes", f);
}

}  // namespace mod::cpu
