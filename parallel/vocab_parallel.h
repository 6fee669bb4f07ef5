// The vocabulary-parallel embedding and cross-entropy: each tp rank holds rows
// [vocab_start, vocab_start + V/tp) of the table (and of the LM head), and full logits are never
// gathered. Shapes: ids, targets [B,T]; table [V/tp, D]; logits [B,T,V/tp].
#pragma once

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mod::parallel {

// Rows of ids outside this rank's range are zero here; the all-reduce (reduce_from_tp) sums
// the one rank that holds each id. ids [B,T] -> [B,T,D], replicated; the table on any device.
// split_sequence (sequence parallelism): a reduce-scatter instead (reduce_scatter_seq_to_tp),
// -> this rank's positions [B,T/tp,D].
Tensor vocab_parallel_embedding(const Tensor& ids, const Tensor& table, int64_t vocab_start,
                                Communicator& tp, bool split_sequence = false);

// Mean cross-entropy over targets != ignore_index, from this rank's logit slice. Forward: an
// all-gather of each slice's logsumexp per row and an all-reduce of the target logit; the
// backward needs none: d logits = (softmax - onehot) / N on the local slice. Targets are ids in
// the whole vocabulary (V = tp x the slice width), checked, on any device.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    int64_t vocab_start, Communicator& tp,
                                    int64_t ignore_index = -100);

}  // namespace mod::parallel
