// ZeRO-1 sharded AdamW, and over a whole model (see zero1.h).
#include "parallel/zero1.h"

#include <stdexcept>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/optim.h"
#include "core/weight_copy.h"

namespace mod::parallel {

ShardedAdamW::ShardedAdamW(std::vector<Param> params, const AdamWArgs& hyper,
                           Communicator& dp, bool multi_tensor, const GradBucketer* grads)
    : params_(std::move(params)), dp_(dp),
      consts_(hyper, params_.empty() ? Device::CPU : params_.front().tensor.device()),
      multi_tensor_(multi_tensor), grads_(grads) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    m_.push_back(Tensor::zeros({chunk(i)}, p.dtype(), p.device()));
    v_.push_back(Tensor::zeros({chunk(i)}, p.dtype(), p.device()));
    total_chunk_ += chunk(i);
  }
  sharded_values_ = !params_.empty() && params_.front().owned_values.defined();
  for (const Param& p : params_)
    if (p.owned_values.defined() != sharded_values_)
      throw std::logic_error("ShardedAdamW: " + p.name +
                             (sharded_values_ ? " has no" : " has") + " owned_values, unlike " +
                             params_.front().name + " (ZeRO-3 shards every parameter or none)");
}

int64_t zero1_chunk(int64_t n, int size) { return (n + size - 1) / size; }

std::pair<int64_t, int64_t> zero1_owned(int64_t n, int rank, int size) {
  const int64_t c = zero1_chunk(n, size), begin = std::min(n, rank * c);
  return {begin, std::min(n, begin + c)};
}

int64_t ShardedAdamW::chunk(size_t i) const {
  return zero1_chunk(params_[i].tensor.numel(), dp_.size());
}

std::pair<int64_t, int64_t> ShardedAdamW::owned(size_t i) const {
  return zero1_owned(params_[i].tensor.numel(), dp_.rank(), dp_.size());
}

Tensor ShardedAdamW::owned_grad(size_t i) const {
  const Tensor& p = params_[i].tensor;
  if (grads_) return grads_->owned_grad(p);
  const auto [begin, end] = owned(i);
  if (!p.grad().defined() || end == begin) return Tensor();
  return p.grad().view({p.numel()}).narrow0(begin, end - begin);
}

void ShardedAdamW::set_learning_rate(double lr) { consts_.set(lr, ++step_); }

void ShardedAdamW::apply(const Tensor& grad_scale, const Tensor& detached_scale) {
  if (params_.empty()) return;  // a pipeline stage holding none of this group
  NoGradGuard no_grad;
  const DType dtype = params_.front().tensor.dtype();
  const Device device = params_.front().tensor.device();
  const bool split = !detached_scale.same(grad_scale);  // the predictor's own clip factor
  // multi_tensor_: this rank's slices, updated in one pass (two when the scales differ)
  std::vector<AdamWSlot> slots, detached;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    const auto [begin, end] = owned(i);
    const int64_t len = end - begin;
    Tensor g = owned_grad(i);
    if (!g.defined()) continue;
    Tensor mine = sharded_values_ ? params_[i].owned_values : p.view({p.numel()}).narrow0(begin, len);
    Tensor m = m_[i].narrow0(0, len), v = v_[i].narrow0(0, len);
    const bool decays = params_[i].decays, own = split && params_[i].detached;
    if (multi_tensor_)
      (own ? detached : slots).push_back({mine, g, m, v, consts_.tensor(decays), Tensor()});
    else
      adamw_update(mine, g, m, v, consts_.args(decays), consts_.tensor(decays),
                   own ? detached_scale : grad_scale);
  }
  if (multi_tensor_) {
    adamw_update_multi(slots, consts_.args(true), grad_scale, table_);
    if (!detached.empty())
      adamw_update_multi(detached, consts_.args(true), detached_scale, detached_table_);
  }
  if (sharded_values_) return;  // ZeRO-3 gathers each unit when it next runs
  Tensor send = Tensor::zeros({total_chunk_}, dtype, device);
  int64_t at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    const auto [begin, end] = owned(i);
    const int64_t len = end - begin;
    if (len > 0) send.narrow0(at, len).copy_from(p.view({p.numel()}).narrow0(begin, len));
    at += chunk(i);
  }
  Tensor all = Tensor::empty({dp_.size() * total_chunk_}, dtype, device);
  dp_.all_gather(send, all);
  // Rank r's slice of parameter i sits at r * total_chunk_ + (offset of i in the send buffer).
  at = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    Tensor flat = p.view({p.numel()});
    const int64_t n = p.numel(), c = chunk(i);
    for (int r = 0; r < dp_.size(); ++r) {
      const int64_t begin = std::min(n, r * c), len = std::min(n, begin + c) - begin;
      if (len > 0) flat.narrow0(begin, len).copy_from(all.narrow0(r * total_chunk_ + at, len));
    }
    at += c;
  }
}

std::pair<Tensor, Tensor> ShardedAdamW::full_moments(size_t i) const {
  const Tensor& p = params_[i].tensor;
  const int64_t c = chunk(i), n = p.numel();
  auto gather = [&](const Tensor& mine) {
    Tensor all = Tensor::empty({dp_.size() * c}, mine.dtype(), mine.device());
    dp_.all_gather(mine, all);
    return all.narrow0(0, n).clone().view(p.shape());
  };
  return {gather(m_[i]), gather(v_[i])};
}

void ShardedAdamW::load_moments(size_t i, const Tensor& m, const Tensor& v) {
  const auto [begin, end] = owned(i);
  const Tensor& p = params_[i].tensor;
  backend_of(m_[i]).fill(m_[i], 0.0);
  backend_of(v_[i]).fill(v_[i], 0.0);
  if (end > begin) {
    m_[i].narrow0(0, end - begin).copy_from(m.view({p.numel()}).narrow0(begin, end - begin));
    v_[i].narrow0(0, end - begin).copy_from(v.view({p.numel()}).narrow0(begin, end - begin));
  }
}

Zero1Optimizer::Zero1Optimizer(const std::vector<ShardedAdamW::Param>& params,
                               const std::vector<bool>& expert, const AdamWArgs& hyper,
                               Communicator& dp, Communicator& edp,
                               const OptimizerFusion& fusion, const GradBucketer* dense_grads,
                               const GradBucketer* expert_grads, const std::vector<bool>& held) {
  std::vector<ShardedAdamW::Param> dense, experts;
  std::vector<std::pair<bool, size_t>> index;  // (expert, index in its group), as params
  std::vector<bool> here;                      // per parameter: held
  for (size_t i = 0; i < params.size(); ++i) {
    here.push_back(held.empty() || held.at(i));
    auto& group = expert[i] ? experts : dense;
    index.emplace_back(expert[i], group.size());
    if (here.back()) group.push_back(params[i]);
    const Tensor& p = params[i].tensor;
    params_.push_back(p);
    if (const auto copy = fusion.copy_dtype(p)) keep_weight_copy(p, *copy);
  }
  const bool multi = fusion.multi_tensor;
  dense_ = std::make_unique<ShardedAdamW>(std::move(dense), hyper, dp, multi, dense_grads);
  if (!experts.empty())
    experts_ = std::make_unique<ShardedAdamW>(std::move(experts), hyper, edp, multi, expert_grads);
  for (size_t i = 0; i < index.size(); ++i) {
    const auto [is_expert, k] = index[i];
    where_.emplace_back(!here[i] ? nullptr : is_expert ? experts_.get() : dense_.get(), k);
  }
}

Zero1Optimizer::~Zero1Optimizer() {
  for (const Tensor& p : params_) drop_weight_copy(p);
}

void Zero1Optimizer::set_learning_rate(double lr) {
  dense_->set_learning_rate(lr);
  if (experts_) experts_->set_learning_rate(lr);
}

void Zero1Optimizer::apply(const Tensor& grad_scale, const Tensor& detached_scale) {
  dense_->apply(grad_scale, detached_scale);
  if (experts_) experts_->apply(grad_scale, detached_scale);
}

void Zero1Optimizer::set_steps_taken(int64_t s) {
  dense_->set_steps_taken(s);
  if (experts_) experts_->set_steps_taken(s);
}

std::pair<Tensor, Tensor> Zero1Optimizer::full_moments(size_t i) const {
  if (!where_[i].first) {
    const Tensor& p = params_[i];
    return {Tensor::zeros(p.shape(), p.dtype(), p.device()),
            Tensor::zeros(p.shape(), p.dtype(), p.device())};
  }
  return where_[i].first->full_moments(where_[i].second);
}

void Zero1Optimizer::load_moments(size_t i, const Tensor& m, const Tensor& v) {
  if (where_[i].first) where_[i].first->load_moments(where_[i].second, m, v);
}

}  // namespace mod::parallel
