// Argument checks shared by the op wrappers. Every failure throws std::invalid_argument whose
// message starts with the op name and names the offending shapes, dtypes or index.
#pragma once

#include <string>

#include "core/tensor.h"

namespace mod {
// The dtype of per-row statistics an op caches for its backward (rstd, mean, lse): the input's,
// except f32 for bf16 (a bf16 lse near 10 is off by 0.03, 3% on every probability).
inline DType stats_dtype(DType input) { return input == DType::BF16 ? DType::F32 : input; }
}  // namespace mod

namespace mod::check {

[[noreturn]] void fail(const char* op, const std::string& what);
void defined(const char* op, const Tensor& t, const char* arg);
// f32, f64 or bf16 (bf16 kernels exist on CUDA only; the CPU's say so when called).
void floating(const char* op, const Tensor& t, const char* arg);
void index(const char* op, const Tensor& t, const char* arg);     // i32 or i64
void dim(const char* op, const Tensor& t, int64_t expected, const char* arg);
void same_shape(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                const char* b_name);
void same_dtype_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                       const char* b_name);
void same_device(const char* op, const Tensor& a, const char* a_name, const Tensor& b,
                 const char* b_name);
// Every entry of idx in [0, limit); names the first bad entry and its position.
void indices_in_range(const char* op, const Tensor& idx, int64_t limit, const char* arg);

}  // namespace mod::check
