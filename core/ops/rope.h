// Rotary position embedding with explicit per-token positions, so a gathered sub-sequence
// (MoD routed tokens) is rotated by its original positions.
// x [B,T,H,Dh] with Dh even, pos [B,T] (i32/i64) -> [B,T,H,Dh]. Pairs (i, i + Dh/2) are
// rotated by angle pos * theta^(-2i/Dh) (the GPT-NeoX / Llama-HF layout).
// Tested by: tests/core/attention_rope_test.cpp (against naive references, errors),
// tests/core/grad_cases_attention_rope.cpp (float64 gradients),
// tests/cuda/parity_attention_routing_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor rope(const Tensor& x, const Tensor& pos, double theta = 10000.0);

}  // namespace mod
