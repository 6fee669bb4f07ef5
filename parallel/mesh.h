// The world's factorisation into data- and tensor-parallel groups (DESIGN.md section 4).
// World rank = dp_rank * tp + tp_rank: tensor parallelism is the fastest axis, so a TP group is
// a run of consecutive ranks and sits inside a node. Expert parallelism (ep | dp) comes with MoDE.
#pragma once

#include <memory>

#include "configs/modtrain.pb.h"
#include "parallel/communicator.h"

namespace mod::parallel {

struct ParallelDims {
  int dp = 1, tp = 1, ep = 1;

  static ParallelDims from_config(const modtrain::ParallelConfig& cfg);
  // dp x tp must equal the world size and ep must divide dp; errors print the equation.
  void validate(int world_size) const;
  // tp must divide the heads, the MLP width and the vocabulary; errors name the field.
  void validate_model(const modtrain::ModelConfig& model) const;
};

class DeviceMesh {
 public:
  // Collective over world: splits it into the dp and tp groups.
  DeviceMesh(Communicator& world, ParallelDims dims);

  Communicator& world() const { return world_; }
  Communicator& dp() const { return *dp_; }  // same tp rank, one rank per dp index
  Communicator& tp() const { return *tp_; }  // same dp rank, consecutive world ranks
  int dp_rank() const { return dp_->rank(); }
  int tp_rank() const { return tp_->rank(); }
  const ParallelDims& dims() const { return dims_; }

 private:
  Communicator& world_;
  ParallelDims dims_;
  std::unique_ptr<Communicator> dp_, tp_;
};

}  // namespace mod::parallel
