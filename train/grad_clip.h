// Global-norm gradient clipping: whole (clip_grad_norm) for one process, or in pieces for a
// norm summed over ranks on the device, whose factor the optimizer applies as it reads each
// gradient (parallel/optimizer.h).
#pragma once

#include <vector>

#include "core/ops/optim.h"
#include "core/tensor.h"

namespace mod::train {

// Scales every gradient by max_norm / (norm + 1e-6) when max_norm > 0 and the norm exceeds it;
// returns the norm before clipping (read on the host).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The pieces of clip_grad_norm, for a norm summed over ranks, all on the gradients' device
// (no host round trip, so a captured step can clip): the sum of squared gradient entries (f64
// scalar on `device`, 0 without gradients), and the norm (f64 scalar tensor) and the factor to
// scale the gradients by (one element in their dtype), given the global sum. A training step
// hands the factor to the optimizer, whose update scales each gradient as it reads it (no pass
// of its own).
// One pass over every gradient (sum_squares_multi, core/ops/optim.h); `table` kept between
// steps spares rewriting the device's table of gradients while they stay in place (the
// overload without one makes a table for the call). Gradients may be views of larger tensors.
Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device, MultiTensorTable& table);
Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device);
// The same over gradient tensors given directly (ZeRO-1's owned slices, parallelize.h).
Tensor sq_sum_of_grads(const std::vector<Tensor>& grads, Device device, MultiTensorTable& table);
struct ClipFactor {
  Tensor norm, factor;
};
ClipFactor clip_factor_for(const std::vector<Tensor>& params, const Tensor& sq, double max_norm);
// The same for gradients of grad_dtype (ZeRO-2's owned slices, which the parameters no longer
// hold as gradients).
ClipFactor clip_factor_for(DType grad_dtype, const Tensor& sq, double max_norm);

}  // namespace mod::train
