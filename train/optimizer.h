// AdamW over a model's named parameters, with the learning-rate schedule and global-norm
// clipping. Decay groups by name: biases, norm gains and embeddings are not decayed unless the
// config says so. The state (moments, step) is exposed for checkpoints.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/ops/optim.h"
#include "core/tensor.h"

namespace mod::train {

// Linear warm-up from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at
// total_steps. step is 0-based.
double learning_rate(const modtrain::OptimizerConfig& cfg, int64_t step, int64_t total_steps);

// Scales every gradient by max_norm / (norm + 1e-6) when max_norm > 0 and the norm exceeds it;
// returns the norm before clipping (read on the host).
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);
// The pieces of clip_grad_norm, for a norm summed over ranks, all on the gradients' device
// (no host round trip, so a captured step can clip): the sum of squared gradient entries (f64
// scalar on `device`, 0 without gradients), and the norm (f64 scalar tensor) and the factor to
// scale the gradients by (one element in their dtype), given the global sum. A training step
// hands the factor to the optimizer, whose update scales each gradient as it reads it (no pass
// of its own).
Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device);
struct ClipFactor {
  Tensor norm, factor;
};
ClipFactor clip_factor_for(const std::vector<Tensor>& params, const Tensor& sq, double max_norm);

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
        const modtrain::OptimizerConfig& cfg);
  // One update at learning rate lr; parameters without a gradient are left alone.
  void step(double lr) {
    set_learning_rate(lr);
    apply();
  }
  // step's two halves: the next update's constants, written to the device from the host (done
  // before a captured step replays), and the update itself (the part a step captures), each
  // gradient multiplied by grad_scale (one element: clip_factor_for's factor) when given.
  void set_learning_rate(double lr);
  void apply(const Tensor& grad_scale = Tensor());
  bool decays(size_t i) const { return decay_[i]; }
  int64_t steps_taken() const { return step_; }

  struct Slot {
    std::string name;
    Tensor param, m, v;
  };
  const std::vector<Slot>& slots() const { return slots_; }
  std::vector<Slot>& slots() { return slots_; }
  void set_steps_taken(int64_t s) { step_ = s; }

 private:
  std::vector<Slot> slots_;
  std::vector<bool> decay_;
  int64_t step_ = 0;
  AdamWStepConstants consts_;
};

// beta1, beta2, eps and weight decay from the config (lr and step are per step).
AdamWArgs adamw_hyper(const modtrain::OptimizerConfig& cfg);

// True for parameters that take weight decay under cfg (matrices of linear layers, by name).
bool takes_weight_decay(const std::string& name, const modtrain::OptimizerConfig& cfg);

}  // namespace mod::train
