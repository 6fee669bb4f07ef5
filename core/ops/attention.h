// Causal multi-head attention as one fused, flash-style tiled op (O(T) memory: no T x S
// buffer). Causality is by explicit position, so a gathered sub-sequence keeps its original
// causal order, and a query block may attend to a longer key cache (decoding).
//   q [B,T,H,Dh], k,v [B,S,H,Dh], q_pos [B,T], k_pos [B,S] (i32/i64, strictly increasing per
//   row) -> out [B,T,H,Dh] = softmax(q k^T / sqrt(Dh) + mask) v, mask: k_pos[j] <= q_pos[i].
// A query with no visible key is an error where the positions are on the CPU (checked here);
// kernels given one on a device return the backend's empty sum (core/backend.h).
// Tested by: tests/core/attention_rope_test.cpp (against naive references, errors),
// tests/core/grad_cases_attention_rope.cpp (float64 gradients),
// tests/cuda/parity_attention_routing_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                 const Tensor& k_pos);
// Self-attention: the same positions for queries and keys.
inline Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& pos) {
  return attention(q, k, v, pos, pos);
}

}  // namespace mod
