// Losses: the sigmoid binary cross-entropy of the MoD causal routing, and the LM head fused with
// its cross-entropy (the fused classifier). Shape legend: N rows (tokens), D width, V vocabulary.
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references and the unfused
// head, errors), tests/core/grad_cases_routing_loss.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mod {

// Sigmoid binary cross-entropy with logits, mean over elements (the MoD causal-routing loss).
// targets are floats in [0, 1] with logits' shape; no gradient flows into targets.
Tensor bce_with_logits(const Tensor& logits, const Tensor& targets);

// The most bytes of logits linear_cross_entropy holds at once: 128 MiB, e.g. 1,334 rows of a
// 50,304-word vocabulary in bf16 (667 in f32).
inline constexpr int64_t kLinearCrossEntropyChunkBytes = int64_t{128} << 20;

// x [..., D], weight [V, D] (same float dtype and device), targets [...] (i32/i64, x's leading
// shape) -> cross_entropy(linear(x, weight), targets, ignore_index): the mean over targets !=
// ignore_index (0 when every target is ignored), the divisor counted on the device. The result
// is a scalar in stats_dtype(x's dtype) (f32 for bf16 x, as the unfused head's loss_precision).
//
// Chunked over rows, chunk_rows at a time (0: as many as fit kLinearCrossEntropyChunkBytes):
// per chunk one GEMM makes the logits, one kernel (Backend::cross_entropy_with_dlogits) takes
// each row's logsumexp and loss and writes dlogits = (softmax - onehot) / count over the logits
// in place, and, when x or weight needs a gradient, two more GEMMs add the chunk's share of
// dx = dlogits weight and dW = dlogits^T x. dx and dW are summed in f32 for bf16 inputs and
// kept until backward, which multiplies them by the loss's incoming gradient (one pass over
// [N,D] and [V,D]) and rounds them to the inputs' dtype.
//
// Why the gradients are made in the forward, rather than keeping every chunk's dlogits (N*V
// held until backward, the unfused head's footprint) or recomputing each chunk's logits in
// backward (a fourth GEMM of 2*N*V*D FLOPs, a third more work in the head): the loss is the
// end of the graph, so the forward already has everything backward needs but the incoming
// gradient, a scalar. Peak memory: one chunk of logits plus dx [N,D] and dW [V,D]; FLOPs:
// the unfused head's. Without grad mode (evaluation) only the loss is computed.
// A host target outside [0, V) that is not ignore_index throws, as cross_entropy's do.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index = -100, int64_t chunk_rows = 0);

// The rows of one chunk for a V-wide vocabulary of `dtype` logits: kLinearCrossEntropyChunkBytes
// over the bytes of one row, at least 1.
int64_t linear_cross_entropy_chunk_rows(int64_t v, DType dtype);

}  // namespace mod
