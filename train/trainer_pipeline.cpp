// The trainer under parallel.pp = world size (see trainer.h): the stages' set-up and a step
// through run_stage_step (parallel/pipeline_runtime.h). Every stage holds the whole model but
// computes, clips and updates only the parameters it owns; the others are brought from their
// owners before anything reads the whole model (evaluation, weights).
#include "model/parameter_roles.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/pipeline_training.h"
#include "train/trainer.h"

namespace mod::train {

void Trainer::setup_pipeline() {
  const int pp = mesh_->dims().pp;
  if (pp == 1) return;
  pipeline_partition_ = parallel::plan_partition(cfg_);
  pipeline_schedule_ = parallel::make_schedule(parallel::schedule_kind(cfg_.parallel()), pp,
                                               cfg_.train().grad_accum());
  tied_embedding_group_ = parallel::make_tied_embedding_group(mesh_->pp());
  // The norms over the stages: each sums the squares of what it owns (the tied embedding on
  // the first stage only), then the sums add over pp; the causal predictors' apart, as in one
  // process.
  parallel::NormGroup model{{}, &mesh_->pp(), nullptr}, predictor{{}, &mesh_->pp(), nullptr};
  for (const auto& [name, t] : model_->named_parameters())
    if (parallel::stage_owns(*pipeline_partition_, mesh_->pp_rank(), name, /*tie_embeddings=*/false))
      (model::is_causal_predictor(name) ? predictor : model).params.push_back(t);
  plan_.norm_groups = {std::move(model)};
  if (!plan_.predictor_norm_groups.empty()) plan_.predictor_norm_groups = {std::move(predictor)};
}

void Trainer::sync_stage_parameters() const {
  if (pipeline_partition_)
    parallel::broadcast_stage_parameters(*model_, *pipeline_partition_, mesh_->pp());
}

Trainer::StepOutputs Trainer::enqueue_pipeline_step() {
  parallel::Communicator& pp = mesh_->pp();
  model_->zero_grad();
  std::vector<parallel::PipelineMicroBatch> mbs;
  for (const auto& [inputs, targets] : step_inputs_) mbs.push_back({inputs, targets});
  parallel::StageStep st =
      parallel::run_stage_step(*model_, *pipeline_schedule_, *pipeline_partition_, pp, mbs);
  parallel::sum_tied_embedding_grads(*model_, tied_embedding_group_.get());
  // lm_loss is the last stage's (0 elsewhere, so the sum is exact); aux_loss adds the stages'.
  Tensor sums = Tensor::from_vector(std::vector<double>{st.lm_loss, st.aux_loss}, {2}, DType::F64);
  pp.all_reduce(sums);
  StepOutputs out;
  out.loss = Tensor::scalar(sums.at(0), DType::F64);
  out.aux = Tensor::scalar(sums.at(1), DType::F64);
  // The last micro-batch's statistics, as one process reports them, all on stage 0.
  model::ForwardResult& last = st.results.back();
  parallel::gather_stage_stats(last.stats, last.moe_stats, pp);
  out.stats = std::move(last.stats);
  out.moe_stats = std::move(last.moe_stats);
  clip_and_update(out);
  return out;
}

}  // namespace mod::train
