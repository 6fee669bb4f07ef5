// A Transformer's parameter names and shapes (see parameter_shapes.h).
#include "model/parameter_shapes.h"

#include "model/routing_schedule.h"

namespace mod::model {

std::vector<std::pair<std::string, Shape>> parameter_shapes(const modtrain::ModelConfig& cfg) {
  const int64_t d = cfg.d_model(), ff = cfg.d_ff(), v = cfg.vocab_size();
  const bool swiglu = cfg.mlp() == modtrain::ModelConfig::SWIGLU;
  const auto& mod = cfg.mod();
  const auto& moe = cfg.moe();
  const int64_t fe = moe.d_expert() > 0 ? moe.d_expert() : ff;
  const int64_t e = moe.n_experts(), e_all = e + (moe.noop_expert() ? 1 : 0);
  const int64_t h = mod.causal().predictor_hidden();
  const bool predictor = mod.causal().method() == modtrain::CausalRoutingConfig::PREDICTOR;
  const auto routed = routed_blocks(cfg), moe_block = moe_blocks(cfg);
  const bool layer_norm = cfg.norm() == modtrain::ModelConfig::LAYER;  // a gain and a bias

  std::vector<std::pair<std::string, Shape>> out{{"embed.weight", {v, d}}};
  for (int b = 0; b < cfg.n_layers(); ++b) {
    const std::string p = "blocks." + std::to_string(b) + ".";
    out.push_back({p + "norm1.weight", {d}});
    if (layer_norm) out.push_back({p + "norm1.bias", {d}});
    for (const char* w : {"wq", "wk", "wv", "wo"}) out.push_back({p + "attn." + w + ".weight", {d, d}});
    out.push_back({p + "norm2.weight", {d}});
    if (layer_norm) out.push_back({p + "norm2.bias", {d}});
    if (moe_block[b]) {
      out.push_back({p + "mlp.router.weight", {e_all, d}});
      if (moe.router_bias()) out.push_back({p + "mlp.router.bias", {e_all}});
      out.push_back({p + "mlp.experts.up", {e, fe, d}});
      if (swiglu) out.push_back({p + "mlp.experts.gate", {e, fe, d}});
      out.push_back({p + "mlp.experts.down", {e, d, fe}});
    } else {
      out.push_back({p + "mlp.up.weight", {ff, d}});
      if (swiglu) out.push_back({p + "mlp.gate.weight", {ff, d}});
      out.push_back({p + "mlp.down.weight", {d, ff}});
    }
    if (!routed[b]) continue;
    out.push_back({p + "router.proj.weight", {1, d}});
    if (mod.router().bias()) out.push_back({p + "router.proj.bias", {1}});
    if (!predictor) continue;
    out.push_back({p + "predictor.in.weight", {h, d}});
    out.push_back({p + "predictor.in.bias", {h}});
    out.push_back({p + "predictor.out.weight", {1, h}});
    out.push_back({p + "predictor.out.bias", {1}});
  }
  out.push_back({"final_norm.weight", {d}});
  if (layer_norm) out.push_back({"final_norm.bias", {d}});
  if (!cfg.tie_embeddings()) out.push_back({"lm_head.weight", {v, d}});
  return out;
}

}  // namespace mod::model
