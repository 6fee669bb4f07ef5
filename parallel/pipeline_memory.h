// Peak memory per pipeline rank (parallel.pp > 1), predicted by walking the rank's schedule
// (pipeline_schedule.h) over the per-block terms of model/memory_plan.h. What the pipeline
// trainer holds (train/trainer_pipeline.cpp, pipeline_runtime.h):
// - every stage builds the whole model, then each rank releases the other stages' parameters
//   (release_other_stages, pipeline_training.h): it holds only the parameters it owns (its
//   tp/ep shards: its chunks' blocks, the embedding on the first stage, final norm and head on
//   the last), their gradients, gradient buckets and AdamW's moments of only those, from ZeRO
//   stage 1 sharded over the stage's dp group (experts over edp) as without pp; ZeRO-3 shards
//   the stage's own units alone (make_sharded_units with its held set), whose outer unit is
//   what the stage holds of the embedding, final norm and head (model::zero3_parameters);
// - each forward's kept activations until its backward (so the micro-batches in flight), and
//   every sent activation and input gradient [b, T, D] f32 until the step ends;
// - every receive buffer [b, T, D] f32 from its round on, which may be issued computes ahead of
//   its reader (pipeline_issue_order.h): an activation's until its forward keeps it, a
//   gradient's until its backward ends; the last stage's fused LM head's chunk of logits;
// - ZeRO-2 and -3 drop a chunk's full gradients after its last micro-batch's backward; stages 1
//   and 2 all-gather the owned slices after the update.
// docs/parallel.md "Pipeline parallelism" has the table; memory_layout_tests checks it.
#pragma once

#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::parallel {

struct PipelineRankMemory {
  int rank = 0;
  double parameters = 0;   // bytes held: the parameters the rank owns (the others released)
  double owned = 0;        // what it computes, reduces and updates: the same parameters
  double gradients = 0;    // the owned parameters' full gradients (ZeRO-2: until released)
  double optimizer = 0;    // AdamW m and v (ZeRO: the owned slices)
  double buckets = 0;      // gradient buckets over the stage's dp group
  double activations = 0;  // the most kept for backward at once, over its micro-batches in flight
  double transfers = 0;    // sent activations and input gradients, held until the step ends
  double receives = 0;     // receive buffers posted ahead of their compute, the most at once
  double peak = 0;
  std::string peak_at;     // e.g. "backward of micro-batch 0, block 2"
};

// One entry per pp rank. Throws std::invalid_argument for pp 1.
std::vector<PipelineRankMemory> plan_pipeline_memory(const modtrain::RunConfig& cfg);

// The fullest rank's predicted peak of a run config: under pp the largest of
// plan_pipeline_memory's, else model::plan_memory's (which is every rank's).
double predicted_peak(const modtrain::RunConfig& cfg);

// The `memory` and `flops` commands' per-rank table under pp.
std::string describe_pipeline_memory(const std::vector<PipelineRankMemory>& ranks);

}  // namespace mod::parallel
