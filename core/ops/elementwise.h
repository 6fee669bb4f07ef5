// Elementwise arithmetic with broadcasting over trailing dims. For a op b, b may have
//   - a's shape;
//   - a suffix of a's shape (repeated over the leading dims, e.g. a bias [D] on [B,T,D]);
//   - a prefix of a's shape padded with trailing 1s (a per-row factor, e.g. [B,C,1] on [B,C,D]).
// The output has a's shape. reshape is here too: a free view with a backward.
// Tested by: tests/core/basic_ops_test.cpp (against naive references, errors),
// tests/core/grad_cases_basic.cpp (float64 gradients),
// tests/cuda/parity_memory_linear_test.cpp (CUDA against CPU), tests/model/autocast_test.cpp
// (autocast reading weight copies).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);
// x [..., D] + bias [D]
Tensor bias_add(const Tensor& x, const Tensor& bias);
Tensor reshape(const Tensor& x, const Shape& shape);
// x converted to another float dtype (bf16 <-> f32 <-> f64); the gradient converts back, so an
// f32 master weight cast to bf16 for a matmul receives an f32 gradient. Always a new tensor.
Tensor cast(const Tensor& x, DType dtype);
// Mixed precision: x cast to the current autocast dtype (AutocastGuard, autograd.h) when one is
// set and x is floating of another dtype; otherwise x itself. A parameter whose optimizer keeps
// a weight copy in that dtype (core/weight_copy.h) gives the copy instead of a new cast, with
// cast's backward.
Tensor autocast(const Tensor& x);
// x for a loss: bf16 is cast to f32 (a bf16 mean of a batch's losses keeps 8 bits); other
// dtypes pass unchanged.
Tensor loss_precision(const Tensor& x);

}  // namespace mod
