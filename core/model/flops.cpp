// FLOP accounting (see flops.h).
#include "core/model/flops.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace mod::model {

std::vector<bool> routed_blocks(const modtrain::ModelConfig& cfg) {
  const int n = cfg.n_layers();
  std::vector<bool> routed(n, false);
  const auto& m = cfg.mod();
  if (!m.enabled()) return routed;
  switch (m.schedule()) {
    case modtrain::MoDConfig::EVERY_OTHER:
      for (int i = 1; i < n; i += 2) routed[i] = true;
      break;
    case modtrain::MoDConfig::EVERY:
      for (int i = 0; i < n; ++i) routed[i] = true;
      break;
    case modtrain::MoDConfig::EVERY_KTH:
      for (int i = m.every_k() - 1; i < n; i += m.every_k()) routed[i] = true;
      break;
    case modtrain::MoDConfig::EXPLICIT:
      for (int b : m.routed_blocks()) routed[b] = true;
      break;
  }
  return routed;
}

double capacity_fraction(const modtrain::ModelConfig& cfg, int block) {
  const auto routed = routed_blocks(cfg);
  if (!routed[block]) return 1.0;
  int ordinal = 0;  // this block's index among routed blocks, for block_capacity
  for (int i = 0; i < block; ++i) ordinal += routed[i];
  const auto& m = cfg.mod();
  return ordinal < m.block_capacity_size() ? m.block_capacity(ordinal) : m.capacity();
}

int64_t capacity_tokens(double fraction, int64_t seq_len) {
  return std::max<int64_t>(1, std::llround(fraction * static_cast<double>(seq_len)));
}

int64_t block_capacity(const modtrain::ModelConfig& cfg, int block) {
  return capacity_tokens(capacity_fraction(cfg, block), cfg.seq_len());
}

FlopCount count_flops(const modtrain::ModelConfig& cfg) {
  const double d = cfg.d_model(), ff = cfg.d_ff(), v = cfg.vocab_size(), s = cfg.seq_len();
  const bool swiglu = cfg.mlp() == modtrain::ModelConfig::SWIGLU;
  const double mlp = (swiglu ? 3.0 : 2.0) * 2.0 * d * ff;  // per token through the block
  const double proj = 4.0 * 2.0 * d * d;                   // q, k, v, o
  const auto routed = routed_blocks(cfg);
  const auto& causal = cfg.mod().causal();
  const double h = causal.predictor_hidden();

  FlopCount out;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    const double c = static_cast<double>(block_capacity(cfg, b));
    // Causal attention: query i of the c tokens sees i + 1 keys; QK^T and PV are 2*d each.
    const double attn = 2.0 * 2.0 * d * (c + 1.0) / 2.0;
    BlockFlops bf{b, routed[b], static_cast<int64_t>(c), (proj + mlp + attn) * c / s};
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
  int64_t per_block = 4 * di * di + (swiglu ? 3 : 2) * di * ffi + 2 * di;  // + 2 norm gains
  int64_t extra = 0;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    if (!routed[b]) continue;
    extra += di + (cfg.mod().router().bias() ? 1 : 0);
    if (causal.method() == modtrain::CausalRoutingConfig::PREDICTOR)
      extra += di * causal.predictor_hidden() + causal.predictor_hidden() +
               causal.predictor_hidden() + 1;
  }
  out.non_embedding_parameters = per_block * cfg.n_layers() + extra + di;  // + final norm
  out.parameters = out.non_embedding_parameters + vi * di * (cfg.tie_embeddings() ? 1 : 2);
  return out;
}

std::string describe_flops(const modtrain::ModelConfig& cfg) {
  const FlopCount f = count_flops(cfg);
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "parameters %.3fM (non-embedding %.3fM)\n",
                f.parameters / 1e6, f.non_embedding_parameters / 1e6);
  os << line << "block  routed  tokens/seq  fwd FLOPs/token\n";
  for (const auto& b : f.blocks) {
    std::snprintf(line, sizeof line, "%5d  %6s  %10lld  %15.4g\n", b.block, b.routed ? "yes" : "no",
                  static_cast<long long>(b.capacity), b.forward_per_token);
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
