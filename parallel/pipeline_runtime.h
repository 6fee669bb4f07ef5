// One pipeline stage's forward and backward of a training step's micro-batches, driven by a
// schedule (parallel/pipeline_schedule.h) over the pp group: activations [B,T,D] f32 ([B,T/tp,D]
// under sequence parallelism: each tp rank sends its part) and their gradients go point to
// point (fixed shapes, known before the step), one tag per link between virtual stages for MPI;
// each round of sends and receives goes as one Communicator::send_recv (one NCCL group: NCCL
// has no tags, see pipeline_issue_order.h); each rank runs the blocks of its v chunks (virtual
// stages r, r + pp, ...; v = 1
// but for interleaved 1F1B) of the partition (parallel/pipeline_partition.h) through
// Transformer::forward_stage.
//
// Invariants:
// - Every stage builds the whole model from the same seed, so its blocks start exactly as
//   one process's; it computes gradients for its own parameters only (the rest get none, and
//   an optimizer skips parameters without a gradient). The trainer then releases the rest
//   (release_other_stages, pipeline_training.h): nothing here reads another stage's parameter.
// - Backward scales each micro-batch's loss by 1/m, as one process's gradient accumulation
//   does, and every stage runs its backwards in micro-batch order.
// - With tied embeddings the first stage's lookup and the last stage's head share one weight:
//   sum_tied_embedding_grads adds their gradients over the two (pp > 1), so both apply the
//   same update and stay equal.
#pragma once

#include <memory>
#include <vector>

#include "core/autograd.h"
#include "model/transformer.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"

namespace mod::parallel {

struct PipelineMicroBatch {
  Tensor tokens, targets;  // [B,T] i64
};

struct StageStep {
  // Sums over the micro-batches of loss / m, f64 scalars on the micro-batches' device (the
  // step reads no device value on the host, so it can be captured as a CUDA graph): lm_loss on
  // the last stage (0 elsewhere); aux_loss of this stage's routed blocks and MoE layers.
  Tensor lm_loss, aux_loss;
  // Per micro-batch: the routing statistics and top-C choices of this rank's blocks, in block
  // order (its chunks' merged; hidden, logits dropped).
  std::vector<model::ForwardResult> results;
  // Wall seconds this stage spent blocked on its receives, and at the step's end on its sends'
  // completion and on the other stages finishing (idle: the bubble, plus transfer time), and
  // in its forwards and backwards. So every stage's wait_s + compute_s is about the step's
  // makespan (the stages start it together, give or take the previous step's last collective).
  // Only on CPUs (timed): on a GPU the host's clocks time the enqueueing, not the work.
  double wait_s = 0, compute_s = 0;
  bool timed = false;
};

// Runs schedule s's actions of rank pp.rank() on its s.virtual_stages chunks (part must have
// as many per rank). Collective over pp; on CPUs ends with a barrier over pp. Gradients accumulate into
// the model's parameters (zero them before). last_backward_ready is passed to each chunk's
// backward of the last micro-batch (the chunk's last), so data-parallel buckets reduce while
// the rest runs; backward_ready to the earlier ones (ZeRO-3 releases its blocks). The tokens
// are read on the first stage only, the targets on the last: the other stages may pass empty
// tensors of the same [B,T] shape.
StageStep run_stage_step(const model::Transformer& model, const PipelineSchedule& s,
                         const PipelinePartition& part, Communicator& pp,
                         const std::vector<PipelineMicroBatch>& microbatches,
                         const LeafGradReady& last_backward_ready = nullptr,
                         const LeafGradReady& backward_ready = nullptr);

// The first and last stages of pp (world ranks in pp's order), for the tied embedding's
// gradient sum; null on the other stages and when pp has one rank. Collective over pp.
std::unique_ptr<Communicator> make_tied_embedding_group(Communicator& pp);
// embed.weight's gradient summed over the group (a no-op without one or without tying).
void sum_tied_embedding_grads(const model::Transformer& model, Communicator* group);

// The whole model's gradient norm (what clipping scales by) from each stage's own gradients:
// every stage sums the squares of what it owns (the tied embedding counted on the first stage
// only), in f64 on the gradients' device, then the sums add over pp; read once at the end. Every parameter with a gradient counts (the
// trainer's separate norm of the causal predictors is not split off yet). Collective over pp.
double pipeline_grad_norm(const model::Transformer& model, const PipelinePartition& part,
                          Communicator& pp);

// The parameters rank pp_rank owns by name: the blocks of its virtual stages, the embedding on
// rank 0, the final norm and head on the last virtual stage's rank (and the tied embedding
// there too).
bool stage_owns(const PipelinePartition& part, int pp_rank, const std::string& name,
                bool tie_embeddings);

}  // namespace mod::parallel
