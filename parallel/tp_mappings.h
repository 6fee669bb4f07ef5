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
#pragma once

#include "core/tensor.h"
#include "parallel/communicator.h"

namespace mod::parallel {

Tensor copy_to_tp(const Tensor& x, Communicator& tp);
Tensor reduce_from_tp(const Tensor& x, Communicator& tp);
Tensor gather_from_tp(const Tensor& x, Communicator& tp);
Tensor scatter_to_tp(const Tensor& x, Communicator& tp);

// x [..., D] -> a copy of columns [start, start + len) of the last dim (no autograd).
Tensor slice_last_dim(const Tensor& x, int64_t start, int64_t len);

}  // namespace mod::parallel
