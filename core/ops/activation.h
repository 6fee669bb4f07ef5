// Pointwise activations, any shape.
// Tested by: tests/core/norm_act_softmax_test.cpp (against naive references, errors),
// tests/core/grad_cases_norm_act_softmax.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's approximation.
Tensor gelu(const Tensor& x);
// x * sigmoid(x)
Tensor silu(const Tensor& x);
// 1 / (1 + exp(-x)); the MoD router's optional gate.
Tensor sigmoid(const Tensor& x);
// silu(gate) * up; gate and up have the same shape (the two halves of a SwiGLU MLP).
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace mod
