// Normalisations over the last dim. x [..., D], weight/bias [D]. The forward caches per-row
// statistics (rstd, and mean for LayerNorm) for the backward. add_rmsnorm and add_layernorm fuse
// the residual add before a norm (a pre-norm block's x + attn(...) then norm2): one pass reads x
// and a once and writes the sum and its norm; the backward adds the gradient reaching the sum
// from its other uses to the norm's, in the same pass. Each output equals the unfused ops'
// bit for bit on the CPU.
// Tested by: tests/core/norm_act_softmax_test.cpp (against naive references, errors),
// tests/core/add_norm_test.cpp (the fused ops against the unfused, bitwise),
// tests/core/grad_cases_norm_act_softmax.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU), tests/model/fusion_test.cpp (whole runs).
#pragma once

#include "core/tensor.h"

namespace mod {

// y = x / sqrt(mean(x^2) + eps) * weight
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// y = (x - mean) / sqrt(var + eps) * weight + bias
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

// The fused residual add + norm's two outputs, both [..., D] like x.
struct AddNorm {
  Tensor sum;     // x + a: the residual stream after the add
  Tensor normed;  // norm(x + a): the next layer's input
};
// sum = x + a (a has x's shape), normed = rmsnorm(sum, weight).
AddNorm add_rmsnorm(const Tensor& x, const Tensor& a, const Tensor& weight, double eps = 1e-5);
// sum = x + a, normed = layernorm(sum, weight, bias).
AddNorm add_layernorm(const Tensor& x, const Tensor& a, const Tensor& weight, const Tensor& bias,
                      double eps = 1e-5);

}  // namespace mod
