// Reductions to a scalar (shape []), accumulated in double on the CPU.
// Tested by: tests/core/basic_ops_test.cpp (against naive references, errors),
// tests/core/grad_cases_basic.cpp (float64 gradients),
// tests/cuda/parity_memory_linear_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

}  // namespace mod
