// Softmax and logsumexp over the last dim, and the fused softmax + cross-entropy over a
// vocabulary.
// Tested by: tests/core/norm_act_softmax_test.cpp (against naive references, errors),
// tests/core/grad_cases_norm_act_softmax.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include <cstdint>

#include "core/op_catalogue.h"
#include "core/tensor.h"

namespace mod {

Tensor softmax(const Tensor& x);
// x [..., V] (V > 0) -> [...]: log(sum(exp(x))) over the last dim, computed as
// max + log(sum(exp(x - max))) so large logits do not overflow (the MoE router z-loss is
// mean(logsumexp(router_logits)^2)). Backward: dx = softmax(x) * dout, recomputed from x.
Tensor logsumexp(const Tensor& x);
// logits [..., V], targets [...] (i32/i64). Mean over targets != ignore_index (a scalar); 0
// when every target is ignored. Never materialises probabilities in the forward, and never
// waits for the host. A host target outside [0, V) that is not ignore_index throws, naming its
// (flat) position and value; device targets are trusted (the data shards are checked).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// Host targets: throws "op: targets[i] = t is out of range [0, v) ..." for the first one
// outside [0, v) that is not ignore_index. Device targets are not read (that would cost a host
// round trip every step): they come from data shards, whose ids read_shard checks.
void check_targets(const char* op, const Tensor& targets, int64_t v, int64_t ignore_index);

// Records on `loss` (recorded as `op`) the gradient of a mean cross-entropy with respect to
// `logits`: d logits = g * inv_count * (exp(logits - lse) - onehot(target)) (inv_count a scalar
// tensor of logits' dtype and device), zero rows where
// ignored. logits may be the columns [vocab_start, vocab_start + V) of a wider vocabulary with lse
// the whole rows' (the vocabulary-parallel loss). Targets are copied (callers often refill their
// batch buffer before backward).
void record_cross_entropy_grad(Tensor& loss, Op op, const Tensor& logits,
                               const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                               int64_t vocab_start, const Tensor& inv_count);

}  // namespace mod
