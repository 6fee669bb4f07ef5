// cuDNN fused scaled-dot-product attention for the shapes it takes: bf16, plain causal masking
// (T == S and q_pos, k_pos the same tensor, so position order equals index order), Dh a multiple
// of 8 up to 128. Each returns false, having done nothing, when it does not apply or cuDNN
// refuses the graph; the caller then runs modtrain's own kernels.
#pragma once
#include "core/tensor.h"
namespace mod::cuda {
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& q_pos, const Tensor& k_pos, Tensor& out, Tensor& lse);
bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& q_pos, const Tensor& k_pos, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv);
}  // namespace mod::cuda
