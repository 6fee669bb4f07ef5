// Matrix multiply, the GEMM-backed op. Shapes (trans flags transpose the last two dims):
//   a [M,K] @ b [K,N]            -> [M,N]
//   a [..., K] @ b [K,N]         -> [..., N]     (leading dims of a flattened: a linear layer)
//   a [Bt,M,K] @ b [Bt,K,N]      -> [Bt,M,N]     (batched)
// Tested by: tests/core/basic_ops_test.cpp (against naive references, errors),
// tests/core/grad_cases_basic.cpp (float64 gradients),
// tests/cuda/parity_memory_linear_test.cpp (CUDA against CPU); row_scores also
// tests/core/row_scores_test.cpp (against cast then linear, bitwise).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., Din] @ weight [Dout, Din]^T: the linear layer with PyTorch's weight layout.
inline Tensor linear(const Tensor& x, const Tensor& weight) {
  return matmul(x, weight, false, true);
}

// x [..., D] @ w [1, D]^T -> [..., 1] in w's dtype, for x in a float dtype no wider than w's:
// what linear(cast(x, w's dtype), w) computes, without x ever held in w's dtype (MoD's router
// and the predictor's logit: bf16 activations against f32 master weights, one read of x instead
// of a cast pass and a read of its f32 copy). dx comes back in x's dtype; w's gradient is added
// in place into a leaf's, as matmul's is. On the CPU it equals cast then linear bit for bit.
Tensor row_scores(const Tensor& x, const Tensor& w);

}  // namespace mod
