// The optimizer interface a training step runs with. parallelize() (parallelize.h) returns one
// in its plan: AdamW (adamw.h), whole on every rank, or ZeRO-1's AdamW (zero1.h), its moments
// sharded over data parallelism. Parameter i is the model's i-th (named_parameters() order);
// the moments move in and out whole (the parameter's shape), so checkpoints never see the layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "core/tensor.h"

namespace mod::parallel {

// How an optimizer runs its update (train.fusions). multi_tensor: every parameter in one
// adamw_update_multi pass (one launch on CUDA) instead of one adamw_update each, bitwise alike.
// weight_copies (with multi_tensor): each parameter keeps a copy in this dtype (the forward's
// autocast dtype, bf16), which the forward reads instead of casting the master and the update
// writes with it (core/weight_copy.h).
struct OptimizerFusion {
  bool multi_tensor = false;
  std::optional<DType> weight_copies;

  // The dtype of the copy the optimizer keeps of `p` (keep_weight_copy), if it keeps one: ZeRO-3
  // decides from it, before any copy is registered, which members it gathers into their copies.
  std::optional<DType> copy_dtype(const Tensor& p) const {
    if (multi_tensor && weight_copies && *weight_copies != p.dtype()) return weight_copies;
    return std::nullopt;
  }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update at learning rate lr; parameters without a gradient are left alone.
  void step(double lr) {
    set_learning_rate(lr);
    apply(Tensor());
  }
  // step's two halves: the next update's constants, written to the device from the host (done
  // before a captured step replays), and the update itself (the part a step captures), each
  // gradient multiplied by grad_scale (one element: clip_factor_for's factor) when defined,
  // the causal predictor's (model::is_causal_predictor) by detached_scale, its own clip factor.
  virtual void set_learning_rate(double lr) = 0;
  virtual void apply(const Tensor& grad_scale, const Tensor& detached_scale) = 0;
  void apply(const Tensor& grad_scale) { apply(grad_scale, grad_scale); }

  // Updates taken so far (bias correction depends on it; checkpoints keep it).
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;
  // Parameter i's moments m and v in full. Collective over its group under ZeRO-1.
  virtual std::pair<Tensor, Tensor> full_moments(size_t i) const = 0;
  // Sets parameter i's moments from full ones (this rank keeps its share).
  virtual void load_moments(size_t i, const Tensor& m, const Tensor& v) = 0;
};

}  // namespace mod::parallel
