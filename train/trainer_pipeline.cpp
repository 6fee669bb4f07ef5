// The trainer under parallel.pp > 1 (see trainer.h): the stages' set-up and a step through
// run_stage_step (parallel/pipeline_runtime.h). Every stage builds the whole model, then
// holds, computes, reduces over its dp group, clips and updates only the parameters it owns;
// the others' storages are released at set-up and grown back, filled from their owners, only
// while something reads the whole model (evaluation, weights, loads: whole_across_stages).
#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include "configs/config.h"
#include "parallel/adamw.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/pipeline_training.h"
#include "train/trainer.h"

namespace mod::train {

void Trainer::setup_pipeline() {
  const int pp = mesh_->dims().pp;
  if (pp == 1) return;
  pipeline_partition_ = parallel::plan_partition(cfg_);
  pipeline_schedule_ = parallel::make_schedule(parallel::schedule_kind(cfg_.parallel()), pp,
                                               cfg_.train().grad_accum(),
                                               cfg_.parallel().virtual_stages());
  tied_embedding_group_ = parallel::make_tied_embedding_group(mesh_->pp());
  const int stage = mesh_->pp_rank(), zero = config::zero_stage(cfg_.parallel());
  const bool tie = cfg_.model().tie_embeddings();
  // What the stage owns (the tied embedding on both ends): its dp group reduces only that.
  std::vector<bool> held;
  std::vector<std::pair<std::string, Tensor>> owned;
  std::vector<int> unit_of;  // ZeRO-3: each owned parameter's unit, one bucket a unit
  for (const auto& [name, t] : model_->named_parameters()) {
    held.push_back(parallel::stage_owns(*pipeline_partition_, stage, name, tie));
    if (!held.back()) continue;
    owned.emplace_back(name, t);
    if (zero >= 3) unit_of.push_back(parallel::zero3_unit(name));
  }
  // ZeRO-3: the stage's units alone (its blocks; the embedding on the first stage, the final
  // norm and head on the last, the tied embedding on both) are sharded over its dp group.
  if (zero >= 3)
    parallel::make_sharded_units(plan_, *model_, *mesh_, optimizer_fusion(cfg_.train()), held);
  parallel::make_grad_buckets(plan_, owned, *mesh_, cfg_.parallel(), unit_of);
  // ZeRO: the stage's dp group shards the moments (stage 2: also the gradients) of what it owns.
  // Without ZeRO: AdamW's moments for what the stage owns only.
  if (zero >= 1) {
    parallel::make_sharded_optimizer(plan_, model_->named_parameters(), *mesh_, cfg_.optimizer(),
                                     optimizer_fusion(cfg_.train()), held);
  } else {
    plan_.optimizer.reset();  // its weight copies go before the new one keeps them
    plan_.optimizer = std::make_unique<parallel::AdamW>(
        model_->named_parameters(), cfg_.optimizer(), optimizer_fusion(cfg_.train()), held);
  }
  // The norms keep the plan's groups (tp-sharded over tp, replicated ones counted once) with
  // only what this stage owns, the tied embedding on the first stage only; grad_clips then adds
  // the stages' sums over pp. The causal predictors' norm apart, as in one process.
  std::unordered_set<const TensorImpl*> counted;
  for (const auto& [name, t] : model_->named_parameters())
    if (parallel::stage_owns(*pipeline_partition_, stage, name, /*tie_embeddings=*/false))
      counted.insert(t.impl_ptr().get());
  for (auto* groups : {&plan_.norm_groups, &plan_.predictor_norm_groups})
    for (parallel::NormGroup& g : *groups)
      std::erase_if(g.params, [&](const Tensor& p) { return !counted.contains(p.impl_ptr().get()); });
  // Last: the other stages' parameters let go (the plan above only took their names and shapes).
  if (!hooks_.keep_other_stages_parameters)
    parallel::release_other_stages(*model_, *pipeline_partition_, stage, tie);
}

parallel::OtherStagesWhole Trainer::whole_across_stages(bool broadcast) const {
  // Under ZeRO-3 the caller holds ParallelPlan::WholeParameters: the owners' units are whole.
  return parallel::OtherStagesWhole(
      *model_, pipeline_partition_ ? &*pipeline_partition_ : nullptr, mesh_->pp(),
      cfg_.model().tie_embeddings(), broadcast, hooks_.keep_other_stages_parameters);
}

Trainer::StepOutputs Trainer::enqueue_pipeline_step() {
  parallel::Communicator& pp = mesh_->pp();
  model_->zero_grad();
  std::vector<parallel::PipelineMicroBatch> mbs;
  for (const auto& [inputs, targets] : step_inputs_) mbs.push_back({inputs, targets});
  // ZeRO-3: the earlier micro-batches' backwards release the blocks, not the outer unit, which
  // another micro-batch in flight may still need (the last backward and finish_grad_sync do).
  parallel::StageStep st = parallel::run_stage_step(
      *model_, *pipeline_schedule_, *pipeline_partition_, pp, mbs, plan_.grad_ready_hook(),
      plan_.units ? plan_.units->release_hook(/*keep_outer=*/true) : LeafGradReady());
  pipeline_wait_s_ += st.wait_s;
  pipeline_compute_s_ += st.compute_s;
  if (hooks_.routing_log)  // per micro-batch, the stage's routed blocks on this rank's rows
    for (const model::ForwardResult& r : st.results) {
      hooks_.routing_log->emplace_back();
      for (const Tensor& idx : r.routed_idx) hooks_.routing_log->back().push_back(idx.to(Device::CPU));
    }
  // dp means of the stage's gradients (its buckets), then the tied embedding's two halves
  // (under ZeRO, the slices the dp rank owns).
  plan_.finish_grad_sync();
  if (config::zero_stage(cfg_.parallel()) >= 1 && plan_.dense_buckets)
    parallel::sum_tied_embedding_owned_grads(*model_, tied_embedding_group_.get(),
                                             *plan_.dense_buckets);
  else
    parallel::sum_tied_embedding_grads(*model_, tied_embedding_group_.get());
  // lm_loss is the last stage's (0 elsewhere, so the sum is exact); aux_loss adds the stages';
  // finish_step then takes the mean over dp. Device scalars: nothing here reads the device.
  StepOutputs out;
  out.loss = st.lm_loss;
  out.aux = st.aux_loss;
  pp.all_reduce(out.loss);
  pp.all_reduce(out.aux);
  // On CPUs the stages' idle and compute seconds ride along: the step's bubble is their idle
  // over their total (report_pipeline_bubble's, per step). On a GPU none is measured.
  if (st.timed) {
    Tensor seconds =
        Tensor::from_vector(std::vector<double>{st.wait_s, st.compute_s}, {2}, DType::F64);
    pp.all_reduce(seconds);
    const double stage_seconds = seconds.at(0) + seconds.at(1);
    out.pp_bubble = stage_seconds > 0 ? seconds.at(0) / stage_seconds : 0.0;
  }
  // The last micro-batch's statistics, as one process reports them; finish_step gathers them
  // on stage 0 once the step is done (they are device tensors until then).
  model::ForwardResult& last = st.results.back();
  out.stats = std::move(last.stats);
  out.moe_stats = std::move(last.moe_stats);
  clip_and_update(out);
  return out;
}

void Trainer::report_pipeline_bubble() {
  if (!pipeline_schedule_) return;
  parallel::Communicator& pp = mesh_->pp();
  if (device_ != Device::CPU) {  // the host's clocks time the enqueueing, not the device
    if (!quiet_ && writer_)
      std::printf("pipeline bubble: not measured on %s (the stages' idle time is device time, "
                  "which the host does not see; metrics.csv has no pp_bubble)\n",
                  device_name(device_));
    return;
  }
  Tensor mine = Tensor::from_vector(std::vector<double>{pipeline_wait_s_, pipeline_compute_s_},
                                    {2}, DType::F64);
  Tensor all = Tensor::empty({2 * pp.size()}, DType::F64);
  pp.all_gather(mine, all);
  MeasuredBubble b;
  double wait = 0, total = 0;
  for (int s = 0; s < pp.size(); ++s) {
    const double w = all.at(2 * s), c = all.at(2 * s + 1);
    b.per_stage.push_back(w + c > 0 ? w / (w + c) : 0.0);
    b.compute_s.push_back(losses_.empty() ? 0.0 : c / static_cast<double>(losses_.size()));
    wait += w;
    total += w + c;
  }
  b.total = total > 0 ? wait / total : 0.0;
  measured_bubble_ = b;
  if (quiet_ || !writer_) return;
  const parallel::PipelineSchedule& s = *pipeline_schedule_;
  std::printf("pipeline bubble: measured %.4f (", b.total);
  for (size_t i = 0; i < b.per_stage.size(); ++i)
    std::printf("%sstage %zu %.4f", i ? ", " : "", i, b.per_stage[i]);
  std::printf("), predicted (pp-1)/(v m+pp-1) = %.4f for equal stages (%s, pp %d, v %d, m %d); "
              "measured: the stages' time blocked on receives, sends and the last stage's end of "
              "step, over that plus their forwards and backwards, in the %zu steps run here\n",
              parallel::predicted_bubble(s.pp, s.microbatches, s.virtual_stages),
              parallel::schedule_name(s.kind), s.pp, s.virtual_stages, s.microbatches,
              losses_.size());
  // The balance the partition aimed at: each stage's measured compute against its predicted
  // FLOPs (parallel/pipeline_partition.h), both as the slowest over the mean.
  const parallel::PipelinePartition part = parallel::plan_partition(cfg_);
  std::vector<double> predicted(pp.size(), 0.0);
  for (int v = 0; v < part.stages(); ++v) predicted[v % pp.size()] += part.forward_per_token[v];
  auto slowest_over_mean = [](const std::vector<double>& x) {
    double sum = 0;
    for (double e : x) sum += e;
    return sum > 0 ? *std::max_element(x.begin(), x.end()) * x.size() / sum : 0.0;
  };
  std::printf("pipeline stages: compute per step");
  for (size_t i = 0; i < b.compute_s.size(); ++i)
    std::printf("%s stage %zu %.4f s", i ? "," : "", i, b.compute_s[i]);
  std::printf("; slowest / mean: measured %.3f, predicted from FLOPs %.3f (%s)\n",
              slowest_over_mean(b.compute_s), slowest_over_mean(predicted),
              part.by_hand ? "parallel.pp_layout" : "partition by cost");
  std::fflush(stdout);
}

}  // namespace mod::train
