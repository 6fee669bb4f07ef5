// The AdamW update, in place and outside autograd: m, v moments as param's shape and dtype.
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references, errors),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU); no gradient: an update, not a graph op.
#pragma once

#include <array>

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
