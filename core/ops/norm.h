// Normalisations over the last dim. x [..., D], weight/bias [D]. The forward caches per-row
// statistics (rstd, and mean for LayerNorm) for the backward.
// Tested by: tests/core/norm_act_softmax_test.cpp (against naive references, errors),
// tests/core/grad_cases_norm_act_softmax.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

// y = x / sqrt(mean(x^2) + eps) * weight
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// y = (x - mean) / sqrt(var + eps) * weight + bias
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace mod
