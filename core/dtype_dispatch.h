// Dtype dispatch for the CPU kernels (g++) and the CUDA kernels (nvcc): calls a kernel template
// with the C++ type of a tensor's runtime DType. Invariant: each dtype's C++ type is named once,
// as a DTypeCase here (bf16, whose type exists only under nvcc, in core/cuda/kernel_utils.cuh);
// a backend's dispatch_float only lists the cases it takes.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/tensor.h"

namespace mod {

// One dtype and its C++ type.
template <DType D, typename T>
struct DTypeCase {
  static constexpr DType dtype = D;
  using type = T;
};
using F32Case = DTypeCase<DType::F32, float>;
using F64Case = DTypeCase<DType::F64, double>;
using I32Case = DTypeCase<DType::I32, int32_t>;
using I64Case = DTypeCase<DType::I64, int64_t>;

// "f32, f64 or bf16": the dtypes of Cases, for error messages.
template <typename... Cases>
std::string dtype_list() {
  const DType dtypes[] = {Cases::dtype...};
  std::string text;
  for (size_t i = 0; i < sizeof...(Cases); ++i)
    text += std::string(i == 0                      ? ""
                        : i + 1 == sizeof...(Cases) ? " or "
                                                    : ", ") +
            dtype_name(dtypes[i]);
  return text;
}

// Calls f(T{}) for the case whose dtype is t; any other dtype throws std::invalid_argument
// "<kernel>: <rule> <the cases' dtypes>, got <t>".
template <typename... Cases, typename F>
void dispatch_dtype(DType t, const char* kernel, const char* rule, F&& f) {
  const bool found = ((t == Cases::dtype ? (f(typename Cases::type{}), true) : false) || ...);
  if (!found)
    throw std::invalid_argument(std::string(kernel) + ": " + rule + " " + dtype_list<Cases...>() +
                                ", got " + dtype_name(t));
}

// Calls f(I{}) for an index tensor's dtype (i32 or i64).
template <typename F>
void dispatch_index(DType t, const char* kernel, F&& f) {
  dispatch_dtype<I32Case, I64Case>(t, kernel, "indices must be", f);
}

}  // namespace mod
