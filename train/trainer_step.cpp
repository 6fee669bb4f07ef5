// One training step (see trainer.h): the host loads the batch and the step's learning rate
// into device tensors, enqueues the step (forward, backward, clipping, update) without waiting
// for the device, and reads the results at the end. Under train.cuda_graph the enqueued part
// is captured once and replayed for every later step.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/pipeline_training.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"

#include <optional>

namespace mod::train {

namespace {
// The dead-rank test's fault (TestHooks::exit_rank): this rank dies between forward and backward.
void maybe_exit_for_test(const TestHooks& hooks, int world_rank, int64_t step) {
  if (!hooks.exits_in(world_rank, step)) return;
  std::fprintf(stderr, "modtrain: rank %d: exiting mid-step %lld (MOD_FAULT_EXIT_STEP)\n",
               world_rank, static_cast<long long>(step + 1));
  std::_Exit(3);
}

// Every number a step reports per block, in one fixed order (the dp reduction packs them so).
template <class F>
void for_each_block_stat(StepMetrics& m, F f) {
  for (auto& s : m.routed) {
    for (double* x : {&s.router_mean, &s.router_std, &s.accuracy, &s.precision, &s.recall}) f(*x);
    for (double& x : s.routed_fraction_by_bucket) f(x);
  }
  for (auto& s : m.moe)
    for (double* x : {&s.unrouted_fraction, &s.noop_fraction, &s.dropped_fraction, &s.max_load})
      f(*x);
}

// Every dp rank saw its own rows: the step's loss and routing statistics are dp means (each
// rank's share of tokens is equal).
void reduce_over_dp(double& loss, double& aux, StepMetrics& m, parallel::Communicator& dp) {
  if (dp.size() == 1) return;
  std::vector<double> v = {loss, aux};
  for_each_block_stat(m, [&](double& x) { v.push_back(x); });
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64);
  dp.all_reduce(t);
  const double inv = 1.0 / dp.size();
  size_t k = 0;
  auto next = [&](double& x) { x = t.data<double>()[k++] * inv; };
  next(loss);
  next(aux);
  for_each_block_stat(m, next);
}

// Eager steps before a graph is captured: the first builds cuBLAS and cuDNN plans and fills
// the allocator's cache, none of which may happen inside a capture.
constexpr int64_t kGraphWarmupSteps = 1;
}  // namespace

// The norm over the language model: each of the plan's groups sums its squares over its
// communicator (tp-sharded over tp, experts over ep, replicated ones counted once; under pp,
// the stage's own parameters, then over pp). Gradients
// are already reduced over dp; under ZeRO only on owned slices, whose squares sum over the
// shard group first. All on the device. The causal predictors' norm, apart, clips them alone.
Trainer::StepClip Trainer::grad_clips() {
  const size_t n_model = plan_.norm_groups.size();
  norm_tables_.resize(n_model + plan_.predictor_norm_groups.size());
  // The factor is made in the gradients' dtype (ZeRO-2's are slices the parameters do not hold).
  DType grad_dtype = DType::F64;
  bool dtype_seen = false;
  auto sq_over = [&](const std::vector<parallel::NormGroup>& groups, size_t first_table) {
    Tensor sq;
    auto table = norm_tables_.begin() + static_cast<std::ptrdiff_t>(first_table);
    for (const parallel::NormGroup& g : groups) {
      const std::vector<Tensor> grads = g.grads();
      if (!dtype_seen && !grads.empty()) {
        grad_dtype = grads.front().dtype();
        dtype_seen = true;
      }
      Tensor group_sq = sq_sum_of_grads(grads, device_, *table++);
      if (g.shard_over && g.shard_over->size() > 1) g.shard_over->all_reduce(group_sq);
      if (g.sum_over && g.sum_over->size() > 1) g.sum_over->all_reduce(group_sq);
      if (sq.defined())
        backend(device_).axpy(1.0, group_sq, sq);
      else
        sq = group_sq;
    }
    // Under pp each stage's groups hold what it owns: the stages' squares add up.
    if (pipeline_partition_ && mesh_->pp().size() > 1) mesh_->pp().all_reduce(sq);
    return sq;
  };
  StepClip c;
  const Tensor model_sq = sq_over(plan_.norm_groups, 0);
  c.model = clip_factor_for(grad_dtype, model_sq, cfg_.optimizer().grad_clip());
  if (!plan_.predictor_norm_groups.empty()) {
    const Tensor predictor_sq = sq_over(plan_.predictor_norm_groups, n_model);
    c.predictor = clip_factor_for(grad_dtype, predictor_sq,
                                  cfg_.model().mod().causal().predictor_grad_clip());
  }
  return c;
}

// Under train.precision BF16 the layers compute in bf16 from the f32 master weights.
model::ForwardResult Trainer::forward_batch(const Tensor& inputs, const Tensor& targets) const {
  if (cfg_.train().precision() != modtrain::TrainConfig::BF16)
    return model_->forward(inputs, targets);
  AutocastGuard bf16(DType::BF16);
  return model_->forward(inputs, targets);
}

// The host's part before a step: the micro-batches copied into the step's input tensors (the
// same tensors every step: a captured step reads them) and the learning rate set.
void Trainer::load_step(int64_t step) {
  const int accum = cfg_.train().grad_accum();
  // Under pp the first stage's ranks use the tokens and the last stage's the targets (their dp
  // rows, both from one read of the windows); the stages between read nothing and only advance
  // the loader, so every rank's loader stays at the same batch.
  const int stage = mesh_->pp_rank(), last_stage = mesh_->dims().pp - 1;
  const bool wants_tokens = stage == 0, wants_targets = stage == last_stage;
  for (int micro = 0; micro < accum; ++micro) {
    if (step_inputs_.size() <= static_cast<size_t>(micro)) {
      const Shape shape{row_end_ - row_begin_, cfg_.model().seq_len()};
      step_inputs_.push_back({Tensor::empty(shape, DType::I64, device_),
                              Tensor::empty(shape, DType::I64, device_)});
    }
    if (!wants_tokens && !wants_targets) {
      const data::LoaderState s = loader_->state();
      loader_->restore({s.seed, s.batches_drawn + 1});
      continue;
    }
    const data::Batch batch = loader_->next(row_begin_, row_end_);
    if (wants_tokens) step_inputs_[micro].first.copy_from(batch.inputs);
    if (wants_targets) step_inputs_[micro].second.copy_from(batch.targets);
  }
  const double lr = learning_rate(cfg_.optimizer(), step, cfg_.train().steps());
  plan_.optimizer->set_learning_rate(lr);
  if (hooks_.poisons(step)) {  // the divergence test's fault (TestHooks::nan_step)
    auto [name, w] = model_->named_parameters().front();
    if (!pipeline_partition_ || parallel::stage_owns(*pipeline_partition_, mesh_->pp_rank(), name,
                                                     cfg_.model().tie_embeddings()))
      w.copy_from(Tensor::full(w.shape(), std::nan(""), w.dtype(), w.device()));
  }
}

// The device's part: nothing here reads a device tensor on the host.
Trainer::StepOutputs Trainer::enqueue_step(int64_t step) {
  if (pipeline_schedule_) {
    // Under pp the rank dies as its stage's step begins, its neighbours waiting on it mid-step.
    maybe_exit_for_test(hooks_, mesh_->world().rank(), step);
    return enqueue_pipeline_step();
  }
  const int accum = cfg_.train().grad_accum();
  model_->zero_grad();
  StepOutputs out;
  out.loss = Tensor::zeros({}, DType::F64, device_);
  out.aux = Tensor::zeros({}, DType::F64, device_);
  Backend& be = backend(device_);
  for (int micro = 0; micro < accum; ++micro) {
    model::ForwardResult r = forward_batch(step_inputs_[micro].first, step_inputs_[micro].second);
    if (hooks_.check_tp_routing) parallel::check_same_routing(r, mesh_->tp());
    if (hooks_.routing_log) {
      hooks_.routing_log->emplace_back();
      for (const Tensor& idx : r.routed_idx) hooks_.routing_log->back().push_back(idx.to(Device::CPU));
    }
    if (hooks_.moe_slots_log) {
      hooks_.moe_slots_log->emplace_back();
      for (const model::MoeStats& m : r.moe_stats)
        hooks_.moe_slots_log->back().push_back(m.slots.defined() ? m.slots.to(Device::CPU) : Tensor());
    }
    maybe_exit_for_test(hooks_, mesh_->world().rank(), step);
    const bool last = micro == accum - 1;
    // Buckets all-reduce during the last micro-batch's backward; earlier ones accumulate
    // (ZeRO-3 releases each unit after its backward in every one).
    backward(scale(r.loss, 1.0 / accum), Tensor(),
             last ? plan_.grad_ready_hook() : plan_.accumulate_hook());
    be.axpy(1.0 / accum, detach(r.lm_loss).to(DType::F64), out.loss);
    if (r.aux_loss.defined()) be.axpy(1.0 / accum, detach(r.aux_loss).to(DType::F64), out.aux);
    if (last) {
      out.stats = std::move(r.stats);
      out.moe_stats = std::move(r.moe_stats);
    }
  }
  plan_.finish_grad_sync();
  clip_and_update(out);
  return out;
}

void Trainer::clip_and_update(StepOutputs& out) {
  const StepClip clip = grad_clips();
  out.grad_norm = clip.model.norm;
  out.predictor_grad_norm = clip.predictor.norm;  // undefined without a predictor
  plan_.optimizer->apply(clip.model.factor, clip.predictor.factor.defined()
                                                ? clip.predictor.factor
                                                : clip.model.factor);
}

// The host waits for the step here, once: losses, norm and routing statistics.
StepMetrics Trainer::finish_step(int64_t step, const StepOutputs& out) {
  auto t = Clock::now();
  double loss = out.loss.item(), aux = out.aux.item();
  const double grad_norm = out.grad_norm.item();
  const std::optional<double> predictor_grad_norm =
      out.predictor_grad_norm.defined() ? std::optional(out.predictor_grad_norm.item())
                                        : std::nullopt;
  host_phases_.wait += seconds_since(t);
  t = Clock::now();
  StepMetrics m;
  m.routed = out.stats;
  m.moe = out.moe_stats;
  if (pipeline_schedule_) {  // each stage's blocks, gathered on stage 0
    parallel::gather_stage_stats(m.routed, m.moe, mesh_->pp());
  } else {
    model::resolve_stats(m.routed);
    model::resolve_moe_stats(m.moe);
  }
  host_phases_.stats += seconds_since(t);
  reduce_over_dp(loss, aux, m, mesh_->dp());
  // Checked after the update (checking before it would wait for the device mid-step); a
  // diverged run stops here and its parameters are never saved.
  if (!std::isfinite(loss) || !std::isfinite(grad_norm) ||
      !std::isfinite(predictor_grad_norm.value_or(0.0)))
    throw std::runtime_error(
        "training diverged at step " + std::to_string(step + 1) + ": loss " +
        std::to_string(loss) + ", gradient norm " + std::to_string(grad_norm) +
        (predictor_grad_norm ? ", predictor gradient norm " + std::to_string(*predictor_grad_norm)
                             : std::string()) +
        " (lower optimizer.lr?)");
  m.lm_loss = loss;
  if (aux != 0) m.aux_loss = aux;
  m.grad_norm = grad_norm;
  m.predictor_grad_norm = predictor_grad_norm;
  m.pp_bubble = out.pp_bubble;
  return m;
}

StepMetrics Trainer::train_step(int64_t step) {
  auto t = Clock::now();
  load_step(step);
  host_phases_.load += seconds_since(t);
  t = Clock::now();
  if (!config::cuda_graph_on(cfg_) || step < start_step_ + kGraphWarmupSteps) {
    const StepOutputs out = enqueue_step(step);
    host_phases_.enqueue += seconds_since(t);
    return finish_step(step, out);
  }
  if (!graph_) {
    // Captured once: the same kernels on the same tensors serve every later step, whose
    // batch and learning rate load_step has just written into the tensors the graph reads.
    Backend& be = backend(device_);
    be.begin_capture();
    try {
      graph_outputs_ = enqueue_step(step);
    } catch (...) {
      try {
        be.end_capture();
      } catch (...) {
      }
      throw;
    }
    graph_ = be.end_capture();
  }
  graph_->replay();
  mesh_->world().watch_enqueued("replayed CUDA-graph step");  // its collectives' timeout
  host_phases_.enqueue += seconds_since(t);
  return finish_step(step, graph_outputs_);
}

}  // namespace mod::train
