// Tensor-parallel collectives as autograd pairs (Megatron-LM's mappings). Each is an op in the
// catalogue (core/op_catalogue.h, collective = true) with its backward beside its forward.
//
//   op               forward                         backward             in -> out (tp ranks)
//   copy_to_tp       identity                        all-reduce sum       [..., D] -> [..., D]
//   reduce_from_tp   all-reduce sum                  identity             [..., D] -> [..., D]
//   gather_from_tp   all-gather along the last dim   keep own slice       [..., D/tp] -> [..., D]
//   scatter_to_tp    keep own slice of the last dim  all-gather           [..., D] -> [..., D/tp]
//
// copy_to_tp goes in front of a column-parallel layer (its input is replicated, its input
// gradient is a sum of partial products), reduce_from_tp behind a row-parallel one.
//
// Sequence parallelism (parallel.sequence_parallel; Megatron's --sequence-parallel) keeps the
// residual stream split over the sequence: tp rank r holds positions [r*T/tp, (r+1)*T/tp) of
// every sequence, and these replace copy_to_tp / reduce_from_tp:
//
//   op                        forward                      backward         in -> out (tp ranks)
//   gather_seq_from_tp        all-gather along dim 1       reduce-scatter   [B, T/tp, ...] -> [B, T, ...]
//   reduce_scatter_seq_to_tp  reduce-scatter along dim 1   all-gather       [B, T, ...] -> [B, T/tp, ...]
//
// A layer that runs whole and identical on every tp rank (the MoE layer: its router, selection
// and gates replicated, its expert slots de-duplicated over tp and all-gathered back) gets a
// whole, identical input gradient on every rank, so under sequence parallelism it is wrapped by
// the dim-1 analogues of gather_from_tp / scatter_to_tp, whose backward keeps or gathers instead
// of summing:
//
//   gather_seq_whole_from_tp  all-gather along dim 1       keep own positions  [B, T/tp, ...] -> [B, T, ...]
//   split_seq_to_tp           keep own positions of dim 1  all-gather          [B, T, ...] -> [B, T/tp, ...]
//
// MoD's routed rows under sequence parallelism (compositions of the ops above and below, so
// their backward rules are those ops'): idx [B,C] holds global positions, the same on every rank.
//   gather_routed_rows        [B, T/tp, D], idx -> [B, C, D] on every rank: each rank writes the
//                             rows it holds into zeros, one all-reduce assembles them (exact:
//                             every row has one non-zero term); backward keeps the rows it holds
//   scatter_add_routed_rows   x [B, T/tp, D] + the rows of y [B, C, D] (every rank's y the same)
//                             this rank holds; backward all-reduces dy (again one term a row)
#pragma once

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mod::parallel {

Tensor copy_to_tp(const Tensor& x, Communicator& tp);
Tensor reduce_from_tp(const Tensor& x, Communicator& tp);
Tensor gather_from_tp(const Tensor& x, Communicator& tp);
Tensor scatter_to_tp(const Tensor& x, Communicator& tp);
Tensor gather_seq_from_tp(const Tensor& x, Communicator& tp);
Tensor reduce_scatter_seq_to_tp(const Tensor& x, Communicator& tp);
Tensor gather_seq_whole_from_tp(const Tensor& x, Communicator& tp);
Tensor split_seq_to_tp(const Tensor& x, Communicator& tp);
Tensor gather_routed_rows(const Tensor& x_BtD, const Tensor& idx_BC, Communicator& tp);
Tensor scatter_add_routed_rows(const Tensor& x_BtD, const Tensor& idx_BC, const Tensor& y_BCD,
                               Communicator& tp);
// [B, T/tp] -> this rank's positions of a [B, T] tensor (no autograd): membership targets.
Tensor own_positions(const Tensor& x_BT, Communicator& tp);

// x [..., D] -> a copy of columns [start, start + len) of the last dim (no autograd).
Tensor slice_last_dim(const Tensor& x, int64_t start, int64_t len);

}  // namespace mod::parallel
