// Which blocks each pipeline stage runs (docs/parallel.md "Pipeline parallelism"), chosen so
// that the stages' predicted forward + backward times are as equal as they can be, from the
// per-block FLOPs of model/flops.h: a routed block at its capacity, the embedding (a lookup, no
// FLOPs) on the first stage, the final norm, LM head and loss on the last. parallel.pp_layout
// sets the blocks per stage by hand instead.
//
// Stages are virtual: with interleaving, rank r runs virtual stages r, r + pp, r + 2 pp, ...
// (parallel/pipeline_schedule.h); every virtual stage holds at least one block, in order.
#pragma once

#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "parallel/pipeline_schedule.h"

namespace mod::parallel {

struct PipelinePartition {
  int pp = 1, virtual_stages = 1;
  bool by_hand = false;                   // from parallel.pp_layout
  std::vector<int> blocks;                // [pp x v] blocks per virtual stage, first to last
  std::vector<double> forward_per_token;  // [pp x v] forward FLOPs per sequence token
  int first_block(int stage) const;
  int stage_of_block(int block) const;
  int rank_of(int stage) const { return stage % pp; }  // virtual stage c x pp + r is on rank r
  int stages() const { return static_cast<int>(blocks.size()); }
  double largest() const;  // the slowest stage's forward FLOPs per token
};

// Contiguous split of per-block costs (plus head_cost on the last stage) into `stages` groups
// of at least one block that minimises the largest group (exact dynamic programme; ties go to
// the split with the smaller sum of squares, then the earlier cut).
std::vector<int> balance_blocks(const std::vector<double>& block_costs, double head_cost,
                                int stages);
// Megatron's layer-count split: n / stages blocks each, the remainder one each to the first.
std::vector<int> equal_block_counts(int n_blocks, int stages);

// parallel.pp_schedule as the schedule generator's kind.
PipelineScheduleKind schedule_kind(const modtrain::ParallelConfig& p);

// parallel.pp x parallel.virtual_stages stages: parallel.pp_layout when it is set, else
// balance_blocks over count_flops(cfg.model()).
PipelinePartition plan_partition(const modtrain::RunConfig& cfg);
PipelinePartition partition_with(const modtrain::ModelConfig& model, int pp, int virtual_stages,
                                 const std::vector<int>& blocks, bool by_hand);

// Training FLOPs of one step on one device of each pp rank: its virtual stages' forward and
// backward (2 x forward) over train.grad_accum micro-batches of train.batch_size / dp sequences,
// split over tp (as each block's matmuls are). Times dp x tp, they add up to one process's step.
std::vector<double> rank_step_flops(const modtrain::RunConfig& cfg);

// The table `modtrain flops` and `modtrain memory` print under pp > 1: each stage's blocks,
// forward + backward FLOPs and time share per micro-batch, the activations of as many
// micro-batches as the schedule keeps in flight on it, the bubble of equal stages and the one
// simulated with these stages' costs, each pp rank's world ranks and FLOPs a step per device
// (rank_step_flops), and each rank's predicted peak (pipeline_memory.h). Empty when
// parallel.pp is 1.
std::string describe_pipeline(const modtrain::RunConfig& cfg);

}  // namespace mod::parallel
