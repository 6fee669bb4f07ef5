// What the trainer needs around run_stage_step (pipeline_runtime.h) to train pp stages (with
// dp and tp inside each stage): the other stages' parameters released on every rank and made
// whole only while the whole model is read (weights, evaluation, loads), and the routing
// statistics of every stage's blocks brought to stage 0, the rank that logs.
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
// the first stage), so every rank holds the whole trained model (its tp shards; the other
// stages' parameters must have their bytes: OtherStagesWhole grows them first). Collective
// over pp.
void broadcast_stage_parameters(const model::Transformer& model, const PipelinePartition& part,
                                Communicator& pp);

// Every stage builds the whole model from the same seed, then each rank keeps the bytes of only
// the parameters its stage owns (stage_owns, the tied embedding on both ends): the others'
// storages are resized to 0 (the tensor objects stay, as ZeRO-3's released parameters do) and
// labelled, so a stray read throws naming the parameter. Outside any CUDA graph capture (the
// trainer calls it at set-up and after each whole-model use).
void release_other_stages(const model::Transformer& model, const PipelinePartition& part,
                          int pp_rank, bool tie_embeddings);

// While it lives, every parameter of the model is whole on this rank: the ones
// release_other_stages let go are grown back and, with `broadcast`, every parameter is
// broadcast from its owner (broadcast_stage_parameters; collective over pp); without it their
// values are undefined until the caller writes them (a load). Its end releases them again (and
// any bf16 weight copy a forward made of them meanwhile). Under ZeRO-3 hold
// ParallelPlan::WholeParameters around it, so the owners' units are whole before the broadcast.
// part null (pp 1): nothing happens. keep: the ranks hold every parameter throughout (a test's
// reference): broadcast only, nothing released.
class OtherStagesWhole {
 public:
  OtherStagesWhole(const model::Transformer& model, const PipelinePartition* part,
                   Communicator& pp, bool tie_embeddings, bool broadcast, bool keep = false);
  ~OtherStagesWhole();
  OtherStagesWhole(const OtherStagesWhole&) = delete;
  OtherStagesWhole& operator=(const OtherStagesWhole&) = delete;

 private:
  const model::Transformer& model_;
  const PipelinePartition* part_;
  int pp_rank_;
  bool tie_, keep_;
};

// Stage 0 receives the other stages' resolved statistics and merges them in block order (so
// its lists cover every routed and MoE block, as one process's do; router histograms stay on
// their stage); the other stages keep their own. Collective over pp.
void gather_stage_stats(std::vector<model::RoutedBlockStats>& routed,
                        std::vector<model::MoeStats>& moe, Communicator& pp);

}  // namespace mod::parallel
