// The AdamW update, in place and outside autograd: m, v moments as param's shape and dtype; per
// tensor, or multi-tensor (every parameter in one pass, optionally writing weight copies). And
// the global norm's square over a list of tensors in one pass (sum_squares_multi).
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references, errors, the
// multi-tensor update against the per-tensor one, weight copies, sum_squares_multi against a
// double reference), tests/cuda/parity_nn_test.cpp (CUDA against CPU); no gradient: an update
// and a norm, not graph ops.
#pragma once

#include <array>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace mod {

// {1 - lr * weight_decay, lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step)}, in double.
std::array<double, kAdamWConstants> adamw_step_constants(const AdamWArgs& args);

// consts: adamw_step_constants(args) as an f64 [kAdamWConstants] tensor on param's device,
// written before the step (a captured step reads it at replay); args supplies beta1, beta2, eps.
// grad_scale: one element in grad's dtype on its device that every gradient entry is multiplied
// by first (the global-norm clip factor, computed on the device), or undefined for 1.
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args,
                  const Tensor& consts, const Tensor& grad_scale = Tensor());
// The same with the constants made from args on the spot (eager use: tests, benchmarks).
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args);

// The multi-tensor update's table of slots on their device, kept between steps: rewritten on
// the device only when a slot's tensors moved (a step's gradients are usually where the last
// step's were), with kernels a captured step can hold (Backend::adamw_update_multi).
class MultiTensorTable {
 public:
  // The rows for slots (numel > 0 only, in order, chunks numbered across them), and whether the
  // device copy must be rewritten: it differs from the last call's.
  const std::vector<MultiTensorEntry>& rows_for(const std::vector<AdamWSlot>& slots,
                                                bool& rewrite);
  // The same for tensors that are only read (sum_squares_multi): each row's `grad` is the
  // tensor's first element (views included), the other pointers null.
  const std::vector<MultiTensorEntry>& rows_for(const std::vector<Tensor>& tensors, bool& rewrite);
  Tensor& device_rows() { return table_; }

 private:
  // rows_ made: decides `rewrite` against the last call's rows and sizes the device table.
  void commit(Device device, bool& rewrite);
  std::vector<MultiTensorEntry> rows_, last_;
  Tensor table_;  // i64, at least rows_.size() MultiTensorEntry rows on the slots' device
};

// adamw_update for every slot at once (AdamWSlot, core/backend.h: each with its group's
// constants, e.g. AdamWStepConstants::tensor, and optionally the parameter's weight copy,
// core/weight_copy.h, written in the same pass). One launch on CUDA; bitwise adamw_update's
// result on every slot (one element function, core/adamw_element.h). args supplies beta1,
// beta2 and eps (and is checked like adamw_update's); grad_scale as adamw_update's, for every
// slot. Slots with numel 0 are skipped. Afterwards each parameter counts as written (a weight
// copy not updated with it is stale).
void adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                        const Tensor& grad_scale, MultiTensorTable& table);

// The sum of every squared entry of every tensor of xs, accumulated in double: an f64 scalar on
// `device` (0 for no elements), read nowhere on the host, so a captured step can hold it. xs
// share one float dtype and `device` (any shapes and sizes; views such as narrow0 slices too).
// One pass over all of them: on CUDA one launch over `table` (rewritten only when a tensor
// moved) and one deterministic reduction of its per-chunk partials; on the CPU tensor after
// tensor. Its order of additions differs from summing per tensor and then over tensors.
Tensor sum_squares_multi(const std::vector<Tensor>& xs, Device device, MultiTensorTable& table);

// One step's constants on a device for the two weight-decay groups (decayed, not), written
// from the host before the step: an optimizer sets them, then its update kernels read them.
class AdamWStepConstants {
 public:
  // hyper: beta1, beta2, eps and the weight decay of decayed parameters.
  AdamWStepConstants(const AdamWArgs& hyper, Device device);
  void set(double lr, int64_t step);  // host -> device
  AdamWArgs args(bool decays) const;  // hyper with this step's lr and step (for the checks)
  const Tensor& tensor(bool decays) const { return decays ? decayed_ : plain_; }

 private:
  AdamWArgs hyper_;
  Tensor decayed_, plain_;
};

}  // namespace mod
