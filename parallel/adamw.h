// AdamW over a model's named parameters, whole on every rank (ZeRO-1's sharded form: zero1.h):
// one pass per parameter, or all in one multi-tensor pass that also writes the parameters'
// weight copies (OptimizerFusion, optimizer.h).
// Decay groups by name: biases, norm gains and embeddings are not decayed unless the config
// says so. The learning-rate schedule and clipping are the trainer's (train/lr_schedule.h,
// train/grad_clip.h).
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
  AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
        const modtrain::OptimizerConfig& cfg, const OptimizerFusion& fusion = {});
  ~AdamW() override;  // the parameters' weight copies go with it

  void set_learning_rate(double lr) override;
  void apply(const Tensor& grad_scale) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t steps) override { step_ = steps; }
  std::pair<Tensor, Tensor> full_moments(size_t i) const override;
  void load_moments(size_t i, const Tensor& m, const Tensor& v) override;
  bool decays(size_t i) const { return decay_[i]; }

 private:
  struct Slot {
    std::string name;
    Tensor param, m, v;
  };
  std::vector<Slot> slots_;
  std::vector<bool> decay_;
  int64_t step_ = 0;
  AdamWStepConstants consts_;
  OptimizerFusion fusion_;
  MultiTensorTable table_;  // fusion_.multi_tensor
};

// beta1, beta2, eps and weight decay from the config (lr and step are per step).
AdamWArgs adamw_hyper(const modtrain::OptimizerConfig& cfg);

// True for parameters that take weight decay under cfg (matrices of linear layers, by name).
bool takes_weight_decay(const std::string& name, const modtrain::OptimizerConfig& cfg);

}  // namespace mod::parallel
