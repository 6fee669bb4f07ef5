// ZeRO-1 (and the optimizer of ZeRO-2): AdamW with its moments sharded over the data-parallel group. Rank r owns elements
// [r * ceil(n / dp), ...) of every parameter's flattened (tp-local) tensor, keeps m and v for
// those only, updates them from the dp-averaged gradient of those elements (the gradient
// buckets reduce-scatter it there, data_parallel.h; the rest of the gradient is not reduced),
// and one all-gather per step brings every rank's updated slices back. Each element sees exactly the AdamW arithmetic of the
// unsharded optimizer, so the result matches it. Zero1Optimizer applies it to a whole model,
// behind the Optimizer interface (optimizer.h). The owned gradient slices are read from the
// reduce-scattering GradBucketer when there is one (under ZeRO-2 the only place they live),
// else from each parameter's whole gradient.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/ops/optim.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/optimizer.h"

namespace mod::parallel {

// ZeRO-1's split of a flattened n-element tensor over a group of `size` ranks: rank r owns
// [r * chunk, min((r + 1) * chunk, n)), chunk = ceil(n / size) (empty past the end). The
// optimizer's moments, its update and the reduce-scattered gradient buckets all use it.
int64_t zero1_chunk(int64_t n, int size);
std::pair<int64_t, int64_t> zero1_owned(int64_t n, int rank, int size);

class ShardedAdamW : public Optimizer {
 public:
  struct Param {
    std::string name;
    Tensor tensor;
    bool decays = true;     // takes weight decay
    bool detached = false;  // the causal predictor's: scaled by apply's detached_scale
    // ZeRO-3 (zero3.h): this rank's slice of the parameter, flattened [owned length], the only
    // copy kept between steps; the update writes it and nothing is all-gathered. Undefined: the
    // owned slice of `tensor` itself, all-gathered after the update (stages 1 and 2).
    Tensor owned_values;
  };
  // hyper: beta1, beta2, eps and the decayed parameters' weight decay (adamw_hyper, adamw.h).
  // multi_tensor: this rank's slices updated in one adamw_update_multi pass. grads: the
  // bucketer that reduce-scatters these parameters' gradients over dp (owned_grad), or null:
  // the owned slice of each parameter's own gradient.
  ShardedAdamW(std::vector<Param> params, const AdamWArgs& hyper, Communicator& dp,
               bool multi_tensor = false, const GradBucketer* grads = nullptr);

  void set_learning_rate(double lr) override;
  // Updates this rank's slice of every parameter with a gradient, then all-gathers them
  // (ZeRO-3: the owned values alone, no all-gather).
  using Optimizer::apply;
  void apply(const Tensor& grad_scale, const Tensor& detached_scale) override;
  int64_t steps_taken() const override { return step_; }
  void set_steps_taken(int64_t s) override { step_ = s; }
  // Gathered over dp (collective); load_moments keeps this rank's slice.
  std::pair<Tensor, Tensor> full_moments(size_t i) const override;
  void load_moments(size_t i, const Tensor& m, const Tensor& v) override;

  size_t size() const { return params_.size(); }
  const Param& param(size_t i) const { return params_[i]; }
  // Elements of parameter i this rank owns: [begin, end) of the flattened tensor.
  std::pair<int64_t, int64_t> owned(size_t i) const;

 private:
  int64_t chunk(size_t i) const;  // ceil(numel / dp)
  Tensor owned_grad(size_t i) const;  // [owned length], undefined without a gradient

  std::vector<Param> params_;
  std::vector<Tensor> m_, v_;  // [chunk] each
  Communicator& dp_;
  int64_t step_ = 0;
  int64_t total_chunk_ = 0;  // sum of chunks: the all-gather's per-rank length
  AdamWStepConstants consts_;
  bool multi_tensor_ = false;
  bool sharded_values_ = false;  // every Param has owned_values (ZeRO-3)
  const GradBucketer* grads_ = nullptr;
  MultiTensorTable table_, detached_table_;
};

// ZeRO-1 for a whole model: the moments of dense parameters sharded over dp, of expert weights
// over edp (the ranks holding the same experts). Parameter i is the model's i-th, as in AdamW.
class Zero1Optimizer : public Optimizer {
 public:
  // expert[i]: parameter i is an expert weight. dense_grads, expert_grads: the reduce-scattering
  // bucketers over dp and edp, or null (see ShardedAdamW).
  // fusion (optimizer.h): weight copies are kept as AdamW keeps them, but the update writes
  // only this rank's slice of a master, so a copy is stale after the all-gather and the next
  // forward rewrites it from its master (one convert per weight, as the cast it replaces).
  // held (empty: every parameter): the parameters this rank updates, a pipeline stage's own;
  // the others keep no moments, full_moments gives zeros for them and load_moments drops them.
  Zero1Optimizer(const std::vector<ShardedAdamW::Param>& params, const std::vector<bool>& expert,
                 const AdamWArgs& hyper, Communicator& dp, Communicator& edp,
                 const OptimizerFusion& fusion = {}, const GradBucketer* dense_grads = nullptr,
                 const GradBucketer* expert_grads = nullptr, const std::vector<bool>& held = {});
  ~Zero1Optimizer() override;

  void set_learning_rate(double lr) override;
  using Optimizer::apply;
  void apply(const Tensor& grad_scale, const Tensor& detached_scale) override;
  int64_t steps_taken() const override { return dense_->steps_taken(); }
  void set_steps_taken(int64_t s) override;
  std::pair<Tensor, Tensor> full_moments(size_t i) const override;
  void load_moments(size_t i, const Tensor& m, const Tensor& v) override;

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<ShardedAdamW> dense_, experts_;  // experts_: null without expert weights
  // Parameter i's optimizer and its index there (null: not held).
  std::vector<std::pair<ShardedAdamW*, size_t>> where_;
};

}  // namespace mod::parallel
