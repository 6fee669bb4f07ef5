// AdamW over a model's named parameters, whole on every rank (ZeRO-1's sharded form: zero1.h):
// one pass per parameter, or all in one multi-tensor pass that also writes the parameters'
// weight copies (OptimizerFusion, optimizer.h).
// Decay groups by name, as optimizer.decay_policy says (takes_weight_decay). The causal
// predictor's parameters (model::is_causal_predictor) take apply's detached_scale. The
// learning-rate schedule and clipping are the trainer's (train/lr_schedule.h, grad_clip.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/ops/optim.h"
#include "parallel/optimizer.h"

namespace mod::parallel {

class AdamW : public Optimizer {
 public:
  // held (empty: every parameter): the parameters this rank updates, a pipeline stage's own;
  // the others get no moments (full_moments: zeros, load_moments: ignored).
  AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
        const modtrain::OptimizerConfig& cfg, const OptimizerFusion& fusion = {},
        const std::vector<bool>& held = {});
  ~AdamW() override;  // the parameters' weight copies go with it

  void set_learning_rate(double lr) override;
  using Optimizer::apply;
  void apply(const Tensor& grad_scale, const Tensor& detached_scale) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }
  std::pair<Tensor, Tensor> full_moments(size_t i) const override;
  void load_moments(size_t i, const Tensor& m, const Tensor& v) override;
  bool decays(size_t i) const { return decay_[i]; }

 private:
  struct Slot {
    std::string name;
    Tensor param, m, v;  // m, v undefined: not held
  };
  std::vector<Slot> slots_;
  std::vector<bool> decay_;
  std::vector<bool> detached_;  // the causal predictor's
  int64_t step_ = 0;
  AdamWStepConstants consts_;
  OptimizerFusion fusion_;
  MultiTensorTable table_, detached_table_;  // fusion_.multi_tensor
};

// beta1, beta2, eps and weight decay from the config (lr and step are per step).
AdamWArgs adamw_hyper(const modtrain::OptimizerConfig& cfg);

// True for parameters that take weight decay under cfg's decay_policy (or the older switches),
// by name (model::parameter_role).
bool takes_weight_decay(const std::string& name, const modtrain::OptimizerConfig& cfg);
// One line for a run's start: the policy, and how many parameters (whole model) it decays.
std::string describe_weight_decay(const modtrain::ModelConfig& model,
                                  const modtrain::OptimizerConfig& cfg);

}  // namespace mod::parallel
