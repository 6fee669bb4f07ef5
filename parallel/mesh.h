// The world's factorisation into data-, tensor-, expert- and pipeline-parallel groups
// (docs/parallel.md). World rank = (pp_rank * dp + dp_rank) * tp + tp_rank: tensor parallelism is
// the fastest axis, so a TP group is a run of consecutive ranks and sits inside a node; then dp;
// pipeline stages are the slowest (Megatron's order), so a stage is a run of dp x tp ranks.
// Expert parallelism splits each dp axis into ep groups (ep | dp; not under pp yet): ep rank =
// dp_rank % ep holds experts [ep_rank * E/ep, ...), so the
// ranks with equal dp_rank % ep (all tp ranks included) hold the same experts and reduce their
// gradients together (edp). Example, dp 4 x tp 2, ep 2 (world ranks):
//   tp  {0,1} {2,3} {4,5} {6,7}      dp  {0,2,4,6} {1,3,5,7}
//   ep  {0,2} {1,3} {4,6} {5,7}      edp {0,1,4,5} {2,3,6,7}
// Example, pp 2 x dp 2 (tp 1): stage 0 = {0,1}, stage 1 = {2,3}; dp {0,1} {2,3}; pp {0,2} {1,3}.
#pragma once

#include <memory>

#include "configs/modtrain.pb.h"
#include "parallel/communicator.h"

namespace mod::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, ep = 1, pp = 1;

  // The four fields, each at least 1 (the error names them).
  static ParallelDims from_config(const modtrain::ParallelConfig& cfg);
  // dp x tp x pp must equal the world size and ep must divide dp; errors print the equation.
  void validate(int world_size) const;
  // tp must divide the heads, the MLP width and the vocabulary; ep > 1 needs model.moe.enabled
  // and must divide model.moe.n_experts. Errors name the field.
  void validate_model(const modtrain::ModelConfig& model) const;
};

class Mesh {
 public:
  // Collective over world: splits it into the dp, tp, ep, edp and pp groups (each within a
  // stage but pp).
  Mesh(Communicator& world, ParallelDims dims);

  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }  // same tp rank, one rank per dp index
  Communicator& tp() const { return *tp_; }  // same dp rank, consecutive world ranks
  // Same tp rank and dp_rank / ep, ordered by dp rank (size ep): the expert all-to-all group.
  Communicator& ep() const { return *ep_; }
  // Same dp_rank % ep, all tp ranks, ordered by world rank (size dp/ep x tp): the ranks holding
  // the same experts, which reduce expert gradients together (expert data parallelism).
  Communicator& edp() const { return *edp_; }
  // One rank of each pipeline stage, the same (dp, tp) ranks, ordered by stage (size pp).
  Communicator& pp() const { return *pp_; }
  int pp_rank() const { return pp_->rank(); }
  int dp_rank() const { return dp_->rank(); }
  int tp_rank() const { return tp_->rank(); }
  int ep_rank() const { return ep_->rank(); }  // = dp_rank % ep
  const ParallelDims& dims() const { return dims_; }

 private:
  Communicator& world_;
  ParallelDims dims_;
  std::unique_ptr<Communicator> dp_, tp_, ep_, edp_, pp_;
};

}  // namespace mod::parallel
