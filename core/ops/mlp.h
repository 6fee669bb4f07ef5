// The GELU MLP as one op: y = gelu(x W_up^T) W_down^T, what linear, gelu and linear compute,
// with GELU in the GEMMs' epilogues (Backend::gemm_gelu, gemm_dgelu): the forward's up GEMM
// writes the pre-activation and its GELU together, and backward's dgrad through W_down
// multiplies by GELU's derivative before it writes (cuBLASLt's GELU_AUX and DGELU on a GPU).
// That removes a read of the pre-activation in the forward and, in backward, a write and two
// reads of [N, F]. It keeps what the unfused ops keep for backward (x, pre, h). On the CPU each
// output and gradient equals the unfused ops' bit for bit.
// Tested by: tests/core/gelu_mlp_test.cpp (against the unfused ops, bitwise; errors),
// tests/core/grad_cases_basic.cpp (float64 gradients),
// tests/cuda/parity_memory_linear_test.cpp (CUDA against CPU), tests/model/fusion_test.cpp
// (whole runs).
#pragma once

#include "core/tensor.h"

namespace mod {

// x [..., D], w_up [F, D], w_down [D, F] (PyTorch's weight layout, no biases) -> [..., D].
Tensor gelu_mlp(const Tensor& x, const Tensor& w_up, const Tensor& w_down);

}  // namespace mod
