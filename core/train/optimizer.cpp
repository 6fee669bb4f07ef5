// AdamW, schedule and clipping (see optimizer.h).
#include "core/train/optimizer.h"

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

double grad_sq_sum(const std::vector<Tensor>& params) {
  double sq = 0;
  for (const Tensor& p : params) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    Tensor s = Tensor::empty({}, g.dtype(), g.device());
    Tensor g2 = Tensor::empty(g.shape(), g.dtype(), g.device());
    Backend& be = backend_of(g);
    be.binary(BinaryKind::Mul, Broadcast::Same, 1, g.numel(), g, g, g2);
    be.sum_all(g2, s);
    sq += s.item();
  }
  return sq;
}

void clip_to_norm(const std::vector<Tensor>& params, double norm, double max_norm) {
  if (!(max_norm > 0 && norm > max_norm)) return;
  const double factor = max_norm / (norm + 1e-6);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) backend_of(g).scale(g, factor, g);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const double norm = std::sqrt(grad_sq_sum(params));
  clip_to_norm(params, norm, max_norm);
  return norm;
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
    : cfg_(cfg) {
  for (auto& [name, p] : named_params) {
    decay_.push_back(takes_weight_decay(name, cfg));
    slots_.push_back({name, p, Tensor::zeros(p.shape(), p.dtype(), p.device()),
                      Tensor::zeros(p.shape(), p.dtype(), p.device())});
  }
}

void AdamW::step(double lr) {
  ++step_;
  NoGradGuard no_grad;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.param.grad().defined()) continue;
    AdamWArgs args;
    args.lr = lr;
    args.beta1 = cfg_.beta1();
    args.beta2 = cfg_.beta2();
    args.eps = cfg_.eps();
    args.weight_decay = decay_[i] ? cfg_.weight_decay() : 0.0;
    args.step = step_;
    adamw_update(s.param, s.param.grad(), s.m, s.v, args);
  }
}

}  // namespace mod::train
