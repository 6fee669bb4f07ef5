// Matrix multiply, the GEMM-backed op. Shapes (trans flags transpose the last two dims):
//   a [M,K] @ b [K,N]            -> [M,N]
//   a [..., K] @ b [K,N]         -> [..., N]     (leading dims of a flattened: a linear layer)
//   a [Bt,M,K] @ b [Bt,K,N]      -> [Bt,M,N]     (batched)
// Tested by: tests/core/basic_ops_test.cpp (against naive references, errors),
// tests/core/grad_cases_basic.cpp (float64 gradients),
// tests/cuda/parity_memory_linear_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., Din] @ weight [Dout, Din]^T: the linear layer with PyTorch's weight layout.
inline Tensor linear(const Tensor& x, const Tensor& weight) {
  return matmul(x, weight, false, true);
}

}  // namespace mod
