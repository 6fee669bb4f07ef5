// parallel_bench's prediction for layouts with pipeline stages (dp x tp x pp, --napkin-only
// --fabric): each pipeline rank's bytes (its stages' gradients over dp, its blocks' tp
// collectives, the activations and their gradients it sends to its neighbours), and the step
// time from the schedule itself, simulated (parallel/pipeline_schedule.h) with each stage's
// compute and tp time and each transfer's time, then the dp gradient reduction after each rank's
// last backward. Predictions, not measurements; docs/parallel.md "On a real cluster" states
// every assumption.
#pragma once

#include <string>
#include <vector>

#include "benchmarks/parallel/parallel_napkin.h"
#include "benchmarks/parallel/parallel_step_time.h"
#include "configs/modtrain.pb.h"

namespace mod::bench {

// One pipeline rank (all of its v virtual stages), per step.
struct PipelineRank {
  std::string blocks;      // e.g. "0-11" or "0-5, 12-17" (one range a virtual stage)
  double local = 0;        // dense parameters on one of its GPUs: split / tp + replicated
  double dp_bytes = 0;     // its gradients over dp: 2 (dp - 1) / dp x 4 B x local
  double tp_bytes = 0;     // its blocks' tp collectives (and the embedding's, head's and loss's)
  double p2p_bytes = 0;    // activations forward and their gradients backward that it sends
                           // ([B/dp, T, D] f32 each; [B/dp, T/tp, D] under sequence parallelism)
  double busy = 0;         // seconds of compute and tp collectives
  double finish = 0;       // when its last backward ends (simulated)
  double tp_step = 0;      // once a step after it: SP's partial gradients summed over tp
  double grad_comm = 0;    // its gradient buckets' transfers and latencies
  double grad_exposed = 0; // of those, what is left after its last backward, with overlap
  double gather = 0;       // ZeRO's all-gather of updated parameters (after the optimizer)
  double state_bytes = 0;  // f32 parameters, gradients and AdamW moments on one of its GPUs
};

struct PipelinePrediction {
  std::string schedule;    // "1f1b" or "interleaved-1f1b"
  int microbatches = 1;
  double transfer = 0;     // seconds one activation (p2p_bytes' unit) takes to the next stage
  double bubble_equal = 0; // (pp - 1) / (v m + pp - 1): equal stages, free transfers
  double bubble = 0;       // simulated: idle / (pp x makespan) with these stages and transfers
  double makespan = 0;     // forward and backward of every micro-batch on every stage
  std::vector<PipelineRank> ranks;
  // The step: every rank's finish + SP's partial gradients + its gradient reduction (exposed
  // with overlap, all of it without) + ZeRO's all-gather; the slowest rank sets it.
  double step(bool overlap) const;
  double busiest() const;  // the largest busy time of a rank
};

// Why the pipeline model does not cover `cfg` under `l` ("" when it does): experts, ZeRO-3,
// too few blocks for pp x v stages, a micro-batch count the schedule refuses.
std::string pipeline_misfit(const modtrain::RunConfig& cfg, const Layout& l);

// The 1F1B schedule (interleaved 1F1B when l.v > 1) over train.grad_accum micro-batches and the
// stage partition modtrain trains with (parallel/pipeline_partition.h, by cost).
PipelinePrediction predict_pipeline(const modtrain::RunConfig& cfg, const Layout& l,
                                    const Fabric& f);

}  // namespace mod::bench
