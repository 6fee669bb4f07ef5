// AdamW whole on every rank (see adamw.h).
#include "parallel/adamw.h"

#include <cstdio>

#include "core/autograd.h"
#include "core/weight_copy.h"
#include "model/parameter_roles.h"
#include "model/parameter_shapes.h"

namespace mod::parallel {

AdamW::AdamW(std::vector<std::pair<std::string, Tensor>> named_params,
             const modtrain::OptimizerConfig& cfg, const OptimizerFusion& fusion,
             const std::vector<bool>& held)
    : consts_(adamw_hyper(cfg),
              named_params.empty() ? Device::CPU : named_params.front().second.device()),
      fusion_(fusion) {
  for (size_t i = 0; i < named_params.size(); ++i) {
    const auto& [name, p] = named_params[i];
    decay_.push_back(takes_weight_decay(name, cfg));
    detached_.push_back(model::is_causal_predictor(name));
    if (!held.empty() && !held.at(i)) {
      slots_.push_back({name, p, Tensor(), Tensor()});
      continue;
    }
    slots_.push_back({name, p, Tensor::zeros(p.shape(), p.dtype(), p.device()),
                      Tensor::zeros(p.shape(), p.dtype(), p.device())});
    if (const auto copy = fusion_.copy_dtype(p)) keep_weight_copy(p, *copy);
  }
}

AdamW::~AdamW() {
  for (Slot& s : slots_)
    if (s.m.defined()) drop_weight_copy(s.param);
}

void AdamW::set_learning_rate(double lr) {
  consts_.set(lr, ++step_);
}

void AdamW::apply(const Tensor& grad_scale, const Tensor& detached_scale) {
  NoGradGuard no_grad;
  // The causal predictor's gradients take their own clip factor; one scale for all otherwise.
  const bool split = !detached_scale.same(grad_scale);
  auto scale_of = [&](size_t i) -> const Tensor& {
    return split && detached_[i] ? detached_scale : grad_scale;
  };
  if (fusion_.multi_tensor) {
    // One pass over every parameter with a gradient (two when the scales differ: the
    // predictor's its own); each copy a forward has read so far is written with its master
    // (allocated_weight_copy: the others are made when first read).
    std::vector<AdamWSlot> slots, detached;
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (!s.m.defined() || !s.param.grad().defined()) continue;
      (split && detached_[i] ? detached : slots)
          .push_back({s.param, s.param.grad(), s.m, s.v, consts_.tensor(decay_[i]),
                      allocated_weight_copy(s.param)});
    }
    adamw_update_multi(slots, consts_.args(true), grad_scale, table_);
    if (!detached.empty())
      adamw_update_multi(detached, consts_.args(true), detached_scale, detached_table_);
    return;
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.m.defined() || !s.param.grad().defined()) continue;
    adamw_update(s.param, s.param.grad(), s.m, s.v, consts_.args(decay_[i]),
                 consts_.tensor(decay_[i]), scale_of(i));
  }
}

std::pair<Tensor, Tensor> AdamW::full_moments(size_t i) const {
  const Slot& s = slots_.at(i);
  if (!s.m.defined())
    return {Tensor::zeros(s.param.shape(), s.param.dtype(), s.param.device()),
            Tensor::zeros(s.param.shape(), s.param.dtype(), s.param.device())};
  return {s.m, s.v};
}

void AdamW::load_moments(size_t i, const Tensor& m, const Tensor& v) {
  if (!slots_.at(i).m.defined()) return;
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
  const model::ParameterRole role = model::parameter_role(name);
  if (role == model::ParameterRole::Matrix) return true;
  switch (cfg.decay_policy()) {
    case modtrain::OptimizerConfig::ALL: return true;
    case modtrain::OptimizerConfig::MATRICES_AND_EMBEDDING:
      if (role == model::ParameterRole::Embedding) return true;
      break;
    case modtrain::OptimizerConfig::MATRICES: break;
  }
  // The older switches (config validation keeps them apart from decay_policy).
  return role == model::ParameterRole::Embedding ? cfg.decay_embeddings()
                                                 : cfg.decay_norms_and_biases();
}

std::string describe_weight_decay(const modtrain::ModelConfig& model,
                                  const modtrain::OptimizerConfig& cfg) {
  int64_t decayed = 0, kept = 0;
  size_t decayed_tensors = 0, kept_tensors = 0;
  bool embedding = false, norm_or_bias = false;
  for (const auto& [name, shape] : model::parameter_shapes(model)) {
    const int64_t n = shape_numel(shape);
    if (takes_weight_decay(name, cfg)) {
      decayed += n;
      ++decayed_tensors;
      continue;
    }
    kept += n;
    ++kept_tensors;
    (model::parameter_role(name) == model::ParameterRole::Embedding ? embedding : norm_or_bias) =
        true;
  }
  const std::string policy =
      cfg.has_decay_norms_and_biases() || cfg.has_decay_embeddings()
          ? "decay_norms_and_biases " + std::string(cfg.decay_norms_and_biases() ? "true" : "false") +
                ", decay_embeddings " + (cfg.decay_embeddings() ? "true" : "false")
          : modtrain::OptimizerConfig::DecayPolicy_Name(cfg.decay_policy());
  char line[256];
  std::snprintf(line, sizeof line,
                "weight decay %g (%s): %.2fM parameters in %zu tensors; not decayed: %.2fM in %zu%s",
                cfg.weight_decay(), policy.c_str(), static_cast<double>(decayed) / 1e6,
                decayed_tensors, static_cast<double>(kept) / 1e6, kept_tensors,
                kept_tensors == 0 ? ""
                : embedding && norm_or_bias ? " (the embedding, norms and biases)"
                : embedding                 ? " (the embedding)"
                                            : " (norms and biases)");
  return line;
}

}  // namespace mod::parallel
