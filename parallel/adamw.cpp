// AdamW whole on every rank (see adamw.h).
#include "parallel/adamw.h"

#include "core/autograd.h"
#include "core/weight_copy.h"

namespace mod::parallel {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
             const modtrain::OptimizerConfig& cfg, const OptimizerFusion& fusion)
    : consts_(adamw_hyper(cfg),
              named_params.empty() ? Device::CPU : named_params.front().second.device()),
      fusion_(fusion) {
  for (auto& [name, p] : named_params) {
    decay_.push_back(takes_weight_decay(name, cfg));
    slots_.push_back({name, p, Tensor::zeros(p.shape(), p.dtype(), p.device()),
                      Tensor::zeros(p.shape(), p.dtype(), p.device())});
    if (fusion_.multi_tensor && fusion_.weight_copies && *fusion_.weight_copies != p.dtype())
      keep_weight_copy(p, *fusion_.weight_copies);
  }
}

AdamW::~AdamW() {
  for (Slot& s : slots_) drop_weight_copy(s.param);
}

void AdamW::set_learning_rate(double lr) {
  consts_.set(lr, ++step_);
}

void AdamW::apply(const Tensor& grad_scale) {
  NoGradGuard no_grad;
  if (fusion_.multi_tensor) {
    // One pass over every parameter with a gradient; each copy a forward has read so far is
    // written with its master (allocated_weight_copy: the others are made when first read).
    std::vector<AdamWSlot> slots;
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.param.grad().defined()) continue;
      slots.push_back({s.param, s.param.grad(), s.m, s.v, consts_.tensor(decay_[i]),
                       allocated_weight_copy(s.param)});
    }
    adamw_update_multi(slots, consts_.args(true), grad_scale, table_);
    return;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.param.grad().defined()) continue;
    adamw_update(s.param, s.param.grad(), s.m, s.v, consts_.args(decay_[i]),
                 consts_.tensor(decay_[i]), grad_scale);
  }
}

std::pair<Tensor, Tensor> AdamW::full_moments(size_t i) const {
  return {slots_.at(i).m, slots_.at(i).v};
}

void AdamW::load_moments(size_t i, const Tensor& m, const Tensor& v) {
  slots_.at(i).m.copy_from(m);
  slots_.at(i).v.copy_from(v);
}

AdamWArgs adamw_hyper(const modtrain::OptimizerConfig& cfg) {
  AdamWArgs args;
  args.beta1 = cfg.beta1();
  args.beta2 = cfg.beta2();
  args.eps = cfg.eps();
  args.weight_decay = cfg.weight_decay();
  return args;
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

}  // namespace mod::parallel
