// Training throughput of a point's model on this machine (`modtrain grid plan --measure`): a few
// full steps (forward, backward, AdamW update) on random tokens, so no corpus is needed. The
// first step is a warm-up and not timed. Data loading, evaluation and checkpoints are left out,
// so a real run is a little slower than this estimate.
#pragma once

#include "configs/modtrain.pb.h"

namespace mod::grid {

struct Throughput {
  double seconds_per_step = 0;  // median of the timed steps (grad_accum micro-batches each)
  double tokens_per_second = 0;
  double flops_per_second = 0;  // training FLOPs (model::count_flops) per second
};

// cfg must be valid; timed_steps >= 1.
Throughput measure_throughput(const modtrain::RunConfig& cfg, int timed_steps);

}  // namespace mod::grid
