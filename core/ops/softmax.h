// Softmax and logsumexp over the last dim, and the fused softmax + cross-entropy over a
// vocabulary.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mod {

Tensor softmax(const Tensor& x);
// x [..., V] (V > 0) -> [...]: log(sum(exp(x))) over the last dim, computed as
// max + log(sum(exp(x - max))) so large logits do not overflow (the MoE router z-loss is
// mean(logsumexp(router_logits)^2)). Backward: dx = softmax(x) * dout, recomputed from x.
Tensor logsumexp(const Tensor& x);
// logits [..., V], targets [...] (i32/i64). Mean over targets != ignore_index (a scalar); 0
// when every target is ignored. Never materialises probabilities in the forward. A target
// outside [0, V) that is not ignore_index throws, naming its (flat) position and value.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

}  // namespace mod
