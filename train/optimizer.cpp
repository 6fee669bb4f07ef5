// AdamW, schedule and clipping (see optimizer.h).
#include "train/optimizer.h"

#include <cmath>
#include <numbers>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/optim.h"

namespace mod::train {

double learning_rate(const modtrain::OptimizerConfig& cfg, int64_t step, int64_t total_steps) {
  const int64_t warmup = cfg.warmup_steps();
  if (step < warmup) return cfg.lr() * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = std::max<int64_t>(1, total_steps - warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return cfg.min_lr() + 0.5 * (cfg.lr() - cfg.min_lr()) * (1.0 + std::cos(std::numbers::pi * progress));
}

Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  Tensor total = Tensor::zeros({}, DType::F64, device);
  if (grads.empty()) return total;
  // One slot per gradient, its squares summed in one pass (accumulating in double), then the
  // slots added up in f64 (as the norm's square of a large model must be).
  const DType dtype = grads.front().dtype();
  Tensor sums = Tensor::zeros({static_cast<int64_t>(grads.size())}, dtype, device);
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (g.dtype() != dtype || g.device() != device)
      throw std::logic_error("grad_sq_sum: gradient " + describe(g) + " differs from " +
                             describe(grads.front()) + " in dtype or device");
    Tensor slot = sums.narrow0(static_cast<int64_t>(i), 1);
    backend_of(g).sum_squares(g, slot);
  }
  backend(device).sum_all(sums.to(DType::F64), total);
  return total;
}

ClipFactor clip_factor_for(const std::vector<Tensor>& params, const Tensor& sq, double max_norm) {
  DType dtype = DType::F64;  // the gradients' (none: the factor scales nothing)
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      dtype = p.grad().dtype();
      break;
    }
  ClipFactor c{Tensor::empty({}, DType::F64, sq.device()), Tensor::empty({}, dtype, sq.device())};
  backend_of(sq).clip_factor(sq, max_norm, c.norm, c.factor);
  return c;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const Device device = params.empty() ? Device::CPU : params.front().device();
  const ClipFactor c = clip_factor_for(params, grad_sq_sum(params, device), max_norm);
  // On the host a factor of 1 is seen for free and the pass skipped; a device always scales.
  if (c.factor.device() == Device::CPU && c.factor.item() == 1.0) return c.norm.item();
  Backend& be = backend(device);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) be.binary(BinaryKind::Mul, Broadcast::Outer, 1, g.numel(), g, c.factor, g);
  }
  return c.norm.item();
}

bool takes_weight_decay(const std::string& name, const modtrain::OptimizerConfig& cfg) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  const bool is_bias = ends_with(".bias");
  const bool is_norm = name.find("norm") != std::string::npos;
  const bool is_embedding = name.rfind("embed.", 0) == 0;
  if (is_bias || is_norm) return cfg.decay_norms_and_biases();
  if (is_embedding) return cfg.decay_embeddings();
  return true;
}

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
             const modtrain::OptimizerConfig& cfg)
    : consts_(adamw_hyper(cfg),
              named_params.empty() ? Device::CPU : named_params.front().second.device()) {
  for (auto& [name, p] : named_params) {
    decay_.push_back(takes_weight_decay(name, cfg));
    slots_.push_back({name, p, Tensor::zeros(p.shape(), p.dtype(), p.device()),
                      Tensor::zeros(p.shape(), p.dtype(), p.device())});
  }
}

void AdamW::set_learning_rate(double lr) { consts_.set(lr, ++step_); }

void AdamW::apply(const Tensor& grad_scale) {
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.param.grad().defined()) continue;
    adamw_update(s.param, s.param.grad(), s.m, s.v, consts_.args(decay_[i]),
                 consts_.tensor(decay_[i]), grad_scale);
  }
}

AdamWArgs adamw_hyper(const modtrain::OptimizerConfig& cfg) {
  AdamWArgs args;
  args.beta1 = cfg.beta1();
  args.beta2 = cfg.beta2();
  args.eps = cfg.eps();
  args.weight_decay = cfg.weight_decay();
  return args;
}

}  // namespace mod::train
