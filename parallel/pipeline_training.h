// What the trainer needs around run_stage_step (pipeline_runtime.h) to train pp stages (with
// dp and tp inside each stage):
// the configurations it refuses, the stages' parameters made whole on every rank (weights,
// evaluation), and the routing statistics of every stage's blocks brought to stage 0, the
// rank that logs.
#pragma once

#include <vector>

#include "configs/modtrain.pb.h"
#include "model/moe.h"
#include "model/routing_stats.h"
#include "model/transformer.h"
#include "parallel/communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_partition.h"

namespace mod::parallel {

// Under ZeRO (reduce-scattered buckets over dp): sum_tied_embedding_grads of the slice of
// embed.weight's gradient this dp rank owns in `buckets` (both ends' dp rank d own the same
// slice), which is where the optimizer and the norm read it. Collective over group.
void sum_tied_embedding_owned_grads(const model::Transformer& model, Communicator* group,
                                    const GradBucketer& buckets);

// Every parameter broadcast from the stage that owns it (stage_owns, the tied embedding from
// the first stage), so every rank holds the whole trained model (its tp shards). Collective
// over pp.
void broadcast_stage_parameters(const model::Transformer& model, const PipelinePartition& part,
                                Communicator& pp);

// Stage 0 receives the other stages' resolved statistics and merges them in block order (so
// its lists cover every routed and MoE block, as one process's do; router histograms stay on
// their stage); the other stages keep their own. Collective over pp.
void gather_stage_stats(std::vector<model::RoutedBlockStats>& routed,
                        std::vector<model::MoeStats>& moe, Communicator& pp);

}  // namespace mod::parallel
