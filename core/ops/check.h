// Argument checks shared by the op wrappers. Every failure throws std::invalid_argument whose
// message starts with the op name and names the offending shapes, dtypes or index.
#pragma once

#include <string>

#include "core/tensor.h"

namespace mod::check {

[[noreturn]] void fail(const char* op, const std::string& what);
void defined(const char* op, const Tensor& t, const char* arg);
void floating(const char* op, const Tensor& t, const char* arg);  // f32 or f64
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
