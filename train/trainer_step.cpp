// One training step (see trainer.h): the host loads the batch and the step's learning rate
// into device tensors, enqueues the step (forward, backward, clipping, update) without waiting
// for the device, and reads the results at the end. Under train.cuda_graph the enqueued part
// is captured once and replayed for every later step.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "train/trainer.h"

namespace mod::train {

namespace {
// Fault injection for the dead-rank test: world rank MOD_FAULT_EXIT_RANK exits with code 3 in
// the middle of step MOD_FAULT_EXIT_STEP (1-based), between its forward and backward, as a
// crashed or OOM-killed process would.
void maybe_exit_for_test(int world_rank, int64_t step) {
  const char* rank = std::getenv("MOD_FAULT_EXIT_RANK");
  const char* at = std::getenv("MOD_FAULT_EXIT_STEP");
  if (rank && at && std::atoi(rank) == world_rank && std::atoll(at) == step + 1) {
    std::fprintf(stderr, "modtrain: rank %d: exiting mid-step %lld (MOD_FAULT_EXIT_STEP)\n",
                 world_rank, static_cast<long long>(step + 1));
    std::_Exit(3);
  }
}

// Eager steps before a graph is captured: the first builds cuBLAS and cuDNN plans and fills
// the allocator's cache, none of which may happen inside a capture.
constexpr int64_t kGraphWarmupSteps = 1;
}  // namespace

// The norm over the whole model: tp-sharded gradients are summed over the tp group, experts
// split over ep over the ep group, replicated ones (identical on every rank of those groups)
// counted once. Gradients are already reduced over dp. All on the device.
Tensor Trainer::global_grad_norm_and_clip() {
  std::vector<Tensor> tp_sharded, ep_sharded, replicated, all;
  for (const auto& [name, t] : model_->named_parameters()) {
    const parallel::ShardSpec& spec = shards_.at(name);
    (spec.dim < 0 ? replicated : spec.expert ? ep_sharded : tp_sharded).push_back(t);
    all.push_back(t);
  }
  Tensor sq = grad_sq_sum(tp_sharded, device_);
  if (mesh_->tp().size() > 1) mesh_->tp().all_reduce(sq);
  Tensor ep_sq = grad_sq_sum(ep_sharded, device_);
  if (mesh_->ep().size() > 1) mesh_->ep().all_reduce(ep_sq);
  Backend& be = backend(device_);
  be.axpy(1.0, ep_sq, sq);
  be.axpy(1.0, grad_sq_sum(replicated, device_), sq);
  return clip_to_sq_sum(all, sq, cfg_.optimizer().grad_clip());
}

// Every dp rank saw its own rows: the step's loss and routing statistics are dp means (each
// rank's share of tokens is equal).
void Trainer::reduce_step_metrics(double& loss, double& aux) {
  if (mesh_->dp().size() == 1) return;
  std::vector<double> v = {loss, aux};
  for (const auto& s : last_stats_) {
    for (double x : {s.router_mean, s.router_std, s.accuracy, s.precision, s.recall})
      v.push_back(x);
    for (double x : s.routed_fraction_by_bucket) v.push_back(x);
  }
  for (const auto& s : last_moe_stats_)
    for (double x : {s.unrouted_fraction, s.noop_fraction, s.dropped_fraction, s.max_load})
      v.push_back(x);
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64);
  mesh_->dp().all_reduce(t);
  const double inv = 1.0 / mesh_->dp().size();
  size_t k = 0;
  auto next = [&] { return t.data<double>()[k++] * inv; };
  loss = next();
  aux = next();
  for (auto& s : last_stats_) {
    for (double* x : {&s.router_mean, &s.router_std, &s.accuracy, &s.precision, &s.recall})
      *x = next();
    for (double& x : s.routed_fraction_by_bucket) x = next();
  }
  for (auto& s : last_moe_stats_)
    for (double* x : {&s.unrouted_fraction, &s.noop_fraction, &s.dropped_fraction, &s.max_load})
      *x = next();
}

// Buckets all-reduce during the last micro-batch's backward; each ignores the other's leaves.
LeafGradReady Trainer::gradient_ready_hook() {
  LeafGradReady dense = buckets_ ? buckets_->ready_hook() : LeafGradReady();
  LeafGradReady experts = expert_buckets_ ? expert_buckets_->ready_hook() : LeafGradReady();
  if (!experts) return dense;
  if (!dense) return experts;
  return [dense, experts](const Tensor& leaf) {
    dense(leaf);
    experts(leaf);
  };
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
  for (int micro = 0; micro < accum; ++micro) {
    const data::Batch batch = loader_->next(row_begin_, row_end_);
    if (step_inputs_.size() <= static_cast<size_t>(micro))
      step_inputs_.push_back(
          {Tensor::empty(batch.inputs.shape(), batch.inputs.dtype(), device_),
           Tensor::empty(batch.targets.shape(), batch.targets.dtype(), device_)});
    step_inputs_[micro].first.copy_from(batch.inputs);
    step_inputs_[micro].second.copy_from(batch.targets);
  }
  const double lr = learning_rate(cfg_.optimizer(), step, cfg_.train().steps());
  if (zero1_) {
    zero1_->set_learning_rate(lr);
    if (zero1_experts_) zero1_experts_->set_learning_rate(lr);
  } else {
    optimizer_->set_learning_rate(lr);
  }
}

// The device's part: nothing here reads a device tensor on the host.
Trainer::StepOutputs Trainer::enqueue_step(int64_t step) {
  const int accum = cfg_.train().grad_accum();
  model_->zero_grad();
  StepOutputs out;
  out.loss = Tensor::zeros({}, DType::F64, device_);
  out.aux = Tensor::zeros({}, DType::F64, device_);
  Backend& be = backend(device_);
  for (int micro = 0; micro < accum; ++micro) {
    model::ForwardResult r = forward_batch(step_inputs_[micro].first, step_inputs_[micro].second);
    if (check_routing_) parallel::check_same_routing(r, mesh_->tp());
    maybe_exit_for_test(mesh_->world().rank(), step);
    const bool last = micro == accum - 1;
    // Buckets all-reduce during the last micro-batch's backward; earlier ones accumulate.
    backward(scale(r.loss, 1.0 / accum), Tensor(), last ? gradient_ready_hook() : LeafGradReady());
    be.axpy(1.0 / accum, detach(r.lm_loss).to(DType::F64), out.loss);
    if (r.aux_loss.defined()) be.axpy(1.0 / accum, detach(r.aux_loss).to(DType::F64), out.aux);
    if (last) {
      out.stats = std::move(r.stats);
      out.moe_stats = std::move(r.moe_stats);
    }
  }
  if (buckets_) buckets_->finish();
  if (expert_buckets_) expert_buckets_->finish();
  out.grad_norm = global_grad_norm_and_clip();
  if (zero1_) {
    zero1_->apply();
    if (zero1_experts_) zero1_experts_->apply();
  } else {
    optimizer_->apply();
  }
  return out;
}

// The host waits for the step here, once: losses, norm and routing statistics.
double Trainer::finish_step(int64_t step, const StepOutputs& out) {
  double loss = out.loss.item(), aux = out.aux.item();
  last_grad_norm_ = out.grad_norm.item();
  last_stats_ = out.stats;
  model::resolve_stats(last_stats_);
  last_moe_stats_ = out.moe_stats;
  model::resolve_moe_stats(last_moe_stats_);
  reduce_step_metrics(loss, aux);
  // Checked after the update (checking before it would wait for the device mid-step); a
  // diverged run stops here and its parameters are never saved.
  if (!std::isfinite(loss) || !std::isfinite(last_grad_norm_))
    throw std::runtime_error("training diverged at step " + std::to_string(step + 1) + ": loss " +
                             std::to_string(loss) + ", gradient norm " +
                             std::to_string(last_grad_norm_) + " (lower optimizer.lr?)");
  last_aux_ = aux;
  return loss;
}

double Trainer::train_step(int64_t step) {
  load_step(step);
  if (!cfg_.train().cuda_graph() || step < start_step_ + kGraphWarmupSteps)
    return finish_step(step, enqueue_step(step));
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
  return finish_step(step, graph_outputs_);
}

}  // namespace mod::train
