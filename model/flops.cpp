// FLOP accounting (see flops.h).
#include "model/flops.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "model/moe_routing.h"
#include "model/routing_schedule.h"

namespace mod::model {

namespace {
// Forward FLOPs per token entering an MoE MLP of t tokens per sequence: the router on every
// token, and each expert's MLP on its K slots (active experts only: E * K / t MLPs per token).
double moe_mlp_flops(const modtrain::ModelConfig& cfg, int64_t t) {
  const auto& m = cfg.moe();
  const double d = cfg.d_model(), f = m.d_expert() > 0 ? m.d_expert() : cfg.d_ff();
  const double e_all = m.n_experts() + (m.noop_expert() ? 1 : 0);
  const double mlp = (cfg.mlp() == modtrain::ModelConfig::SWIGLU ? 3.0 : 2.0) * 2.0 * d * f;
  const double slots_per_token = static_cast<double>(m.n_experts() * expert_slots(m, t)) / t;
  return 2.0 * d * e_all + slots_per_token * mlp;
}
}  // namespace

FlopCount count_flops(const modtrain::ModelConfig& cfg) {
  const double d = cfg.d_model(), ff = cfg.d_ff(), v = cfg.vocab_size(), s = cfg.seq_len();
  const bool swiglu = cfg.mlp() == modtrain::ModelConfig::SWIGLU;
  const double mlp = (swiglu ? 3.0 : 2.0) * 2.0 * d * ff;  // per token through the block
  const double proj = 4.0 * 2.0 * d * d;                   // q, k, v, o
  const auto routed = routed_blocks(cfg), moe = moe_blocks(cfg);
  const auto capacities = block_capacities(cfg);
  const auto& causal = cfg.mod().causal();
  const double h = causal.predictor_hidden();

  FlopCount out;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    const int64_t ci = capacities[b];
    const double c = static_cast<double>(ci);
    // Causal attention: query i of the c tokens sees i + 1 keys; QK^T and PV are 2*d each.
    const double attn = 2.0 * 2.0 * d * (c + 1.0) / 2.0;
    const double block_mlp = moe[b] ? moe_mlp_flops(cfg, ci) : mlp;
    BlockFlops bf{b, routed[b], ci, (proj + block_mlp + attn) * c / s, moe[b]};
    if (routed[b]) {
      double extra = 2.0 * d;  // router r = w.x on every token
      if (causal.method() == modtrain::CausalRoutingConfig::PREDICTOR)
        extra += 2.0 * d * h + 2.0 * h;  // predictor MLP on every token
      out.router_and_predictor_per_token += extra;
      bf.forward_per_token += extra;
    }
    out.forward_per_token += bf.forward_per_token;
    out.blocks.push_back(bf);
  }
  out.lm_head_per_token = 2.0 * d * v;
  out.forward_per_token += out.lm_head_per_token;
  out.training_per_token = 3.0 * out.forward_per_token;

  const int64_t di = cfg.d_model(), ffi = cfg.d_ff(), vi = cfg.vocab_size();
  // Each norm has a gain, and a bias under LAYER.
  const int64_t norm = (cfg.norm() == modtrain::ModelConfig::LAYER ? 2 : 1) * di;
  int64_t per_block = 4 * di * di + (swiglu ? 3 : 2) * di * ffi + 2 * norm;
  int64_t extra = 0;
  const auto& me = cfg.moe();
  const int64_t fe = me.d_expert() > 0 ? me.d_expert() : ffi;
  const int64_t e_all = me.n_experts() + (me.noop_expert() ? 1 : 0);
  for (int b = 0; b < cfg.n_layers(); ++b) {
    if (moe[b])  // E expert MLPs and the router replace the dense MLP
      extra += me.n_experts() * (swiglu ? 3 : 2) * di * fe - (swiglu ? 3 : 2) * di * ffi +
               e_all * di + (me.router_bias() ? e_all : 0);
    if (!routed[b]) continue;
    extra += di + (cfg.mod().router().bias() ? 1 : 0);
    if (causal.method() == modtrain::CausalRoutingConfig::PREDICTOR)
      extra += di * causal.predictor_hidden() + causal.predictor_hidden() +
               causal.predictor_hidden() + 1;
  }
  out.non_embedding_parameters = per_block * cfg.n_layers() + extra + norm;  // + final norm
  out.parameters = out.non_embedding_parameters + vi * di * (cfg.tie_embeddings() ? 1 : 2);
  return out;
}

std::string describe_flops(const modtrain::ModelConfig& cfg) {
  const FlopCount f = count_flops(cfg);
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "parameters %.3fM (non-embedding %.3fM)\n",
                f.parameters / 1e6, f.non_embedding_parameters / 1e6);
  os << line << "block  routed  mlp  tokens/seq  fwd FLOPs/token\n";
  for (const auto& b : f.blocks) {
    std::snprintf(line, sizeof line, "%5d  %6s  %3s  %10lld  %15.4g\n", b.block, b.routed ? "yes" : "no",
                  b.moe ? "moe" : "mlp", static_cast<long long>(b.capacity), b.forward_per_token);
    os << line;
  }
  std::snprintf(line, sizeof line,
                "LM head %.4g, router+predictor %.4g\nforward %.4g FLOPs/token, training %.4g "
                "FLOPs/token (3 x forward)\n",
                f.lm_head_per_token, f.router_and_predictor_per_token, f.forward_per_token,
                f.training_per_token);
  os << line;
  return os.str();
}

}  // namespace mod::model
