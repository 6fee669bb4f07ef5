// The bound on model sizes (see model_size.h).
#include "configs/model_size.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace mod::config {

int64_t parameter_upper_bound(const modtrain::ModelConfig& m) {
  const int64_t d = m.d_model(), ff = m.d_ff(), v = m.vocab_size();
  const int64_t mats = m.mlp() == modtrain::ModelConfig::SWIGLU ? 3 : 2;
  int64_t mlp = mats * d * ff;
  const auto& e = m.moe();
  if (e.enabled()) {  // E experts and their router in place of the dense MLP
    const int64_t fe = e.d_expert() > 0 ? e.d_expert() : ff;
    const int64_t e_all = e.n_experts() + (e.noop_expert() ? 1 : 0);
    mlp = std::max(mlp, e.n_experts() * mats * d * fe + e_all * d + (e.router_bias() ? e_all : 0));
  }
  int64_t block = 4 * d * d + 2 * d + mlp;  // q, k, v, o; two norm gains
  if (m.mod().enabled()) {  // router and predictor MLP
    const int64_t h = m.mod().causal().predictor_hidden();
    block += d + (m.mod().router().bias() ? 1 : 0);
    if (m.mod().causal().method() == modtrain::CausalRoutingConfig::PREDICTOR)
      block += d * h + 2 * h + 1;
  }
  // Largest term at the ceilings: 1024 blocks x 3 x 2^12 x 2^20 x 2^16 < 2^61.
  return m.n_layers() * block + d + v * d * (m.tie_embeddings() ? 1 : 2);
}

void check_model_size(const modtrain::ModelConfig& m) {
  struct Size {
    const char* field;
    int64_t value, ceiling;
  };
  const Size sizes[] = {
      {"model.vocab_size", m.vocab_size(), kMaxVocab},
      {"model.d_model", m.d_model(), kMaxWidth},
      {"model.n_layers", m.n_layers(), kMaxLayers},
      {"model.d_ff", m.d_ff(), kMaxHidden},
      {"model.seq_len", m.seq_len(), kMaxSeqLen},
      {"model.mod.causal.predictor_hidden", m.mod().causal().predictor_hidden(), kMaxWidth},
      {"model.moe.n_experts", m.moe().n_experts(), kMaxExperts},
      {"model.moe.d_expert", m.moe().d_expert(), kMaxHidden},
  };
  for (const Size& s : sizes)
    if (s.value > s.ceiling)
      throw std::invalid_argument("config: " + std::string(s.field) + ": " +
                                  std::to_string(s.value) + " must be at most " +
                                  std::to_string(s.ceiling) + " (the bound on model sizes)");
  const int64_t params = parameter_upper_bound(m);
  if (params > kMaxParameters) {
    char what[256];
    std::snprintf(what, sizeof what,
                  "config: model: up to %.4g parameters exceed the bound %.4g (2^40); reduce "
                  "model.n_layers, d_model, d_ff, vocab_size or moe.n_experts",
                  static_cast<double>(params), static_cast<double>(kMaxParameters));
    throw std::invalid_argument(what);
  }
}

}  // namespace mod::config
