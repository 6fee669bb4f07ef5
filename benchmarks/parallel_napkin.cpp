// The layouts and the napkin minimum of parallel_bench (see parallel_napkin.h).
#include "benchmarks/parallel_napkin.h"

#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "core/model/flops.h"

namespace mod::bench {

std::string Layout::label() const {
  char s[64];
  if (tp == 1)
    std::snprintf(s, sizeof s, "dp%d", dp);
  else if (dp == 1)
    std::snprintf(s, sizeof s, "tp%d", tp);
  else
    std::snprintf(s, sizeof s, "dp%dxtp%d", dp, tp);
  return std::string(s) + (zero1 ? "+zero1" : "");
}

Layout parse_layout(const std::string& text) {
  Layout l;
  std::string body = text;
  if (const auto plus = body.find('+'); plus != std::string::npos) {
    if (body.substr(plus) != "+zero1")
      throw std::invalid_argument("layout '" + text + "': only '+zero1' may follow a '+'");
    l.zero1 = true;
    body = body.substr(0, plus);
  }
  std::stringstream parts(body);
  std::string part;
  bool any = false;
  while (std::getline(parts, part, 'x')) {
    const bool is_dp = part.rfind("dp", 0) == 0, is_tp = part.rfind("tp", 0) == 0;
    const std::string digits = part.size() > 2 ? part.substr(2) : "";
    if ((!is_dp && !is_tp) || digits.empty() ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("layout '" + text + "': expected dpN, tpN or dpNxtpM (+zero1)");
    (is_dp ? l.dp : l.tp) = std::stoi(digits);
    any = true;
  }
  if (!any || l.dp < 1 || l.tp < 1)
    throw std::invalid_argument("layout '" + text + "': expected dpN, tpN or dpNxtpM (+zero1)");
  return l;
}

std::vector<Layout> default_layouts(int n) {
  if (n == 1) return {{1, 1, false}};
  if (n == 2) return {{2, 1, false}, {1, 2, false}, {2, 1, true}};
  if (n == 4) return {{2, 2, false}, {4, 1, false}, {1, 4, false}};
  return {{n, 1, false}, {n, 1, true}};
}

std::string fmt(const char* format, double a, double b, double c, double d, double e, double f) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, a, b, c, d, e, f);
  return buf;
}

Napkin napkin(const modtrain::RunConfig& cfg, const Layout& l) {
  const auto& m = cfg.model();
  const int64_t d = m.d_model(), f = m.d_ff(), v = m.vocab_size(), layers = m.n_layers();
  const int64_t t = m.seq_len(), b = cfg.train().batch_size(), a = cfg.train().grad_accum();
  const int mlp_mats = m.mlp() == modtrain::ModelConfig::SWIGLU ? 3 : 2;
  Napkin n;
  n.params = model::count_flops(m).parameters;
  n.split = layers * (4 * d * d + mlp_mats * d * f) + v * d * (m.tie_embeddings() ? 1 : 2);
  n.replicated = n.params - n.split;
  n.local = static_cast<double>(n.split) / l.tp + static_cast<double>(n.replicated);
  n.params_formula =
      fmt("P_local = P_split / tp + P_replicated = %.0f / %.0f + %.0f = %.0f",
          static_cast<double>(n.split), l.tp, static_cast<double>(n.replicated), n.local);

  const double dp = l.dp, tp = l.tp;
  const double ring = 2 * (dp - 1) / dp * 4 * n.local, gather = (dp - 1) / dp * 4 * n.local;
  n.dp_bytes = ring + (l.zero1 ? gather : 0);
  n.dp_formula = l.zero1 ? fmt("(2 + 1)(dp - 1) / dp x 4 B x P_local = 3 x %.0f / %.0f x 4 x %.0f "
                               "= %.3f MB (all-reduce + all-gather)",
                               dp - 1, dp, n.local, n.dp_bytes / 1e6)
                         : fmt("2 (dp - 1) / dp x 4 B x P_local = 2 x %.0f / %.0f x 4 x %.0f = "
                               "%.3f MB",
                               dp - 1, dp, n.local, n.dp_bytes / 1e6);

  int64_t sum_tb = 0, routed = 0, c = t;
  for (int blk = 0; blk < layers; ++blk) {
    sum_tb += model::block_capacity(m, blk);
    if (model::routed_blocks(m)[blk]) {
      ++routed;
      c = model::block_capacity(m, blk);
    }
  }
  const double rows = static_cast<double>(b) / dp;
  const double inner = 4.0 * d * (4.0 * sum_tb + 2.0 * t) + 8.0 * 3 * t;
  n.tp_bytes = 2 * (tp - 1) / tp * a * rows * inner;
  const std::string tb =
      routed == 0 ? fmt("sum T_b = %.0f x %.0f", layers, t)
                  : fmt("sum T_b = %.0f x %.0f + %.0f x C %.0f", layers - routed, t, routed, c);
  n.tp_formula =
      fmt("2 (tp - 1) / tp x a x B / dp x [4 B x D x (4 sum T_b + 2 T) + 8 B x 3 T] = 2 x %.0f / "
          "%.0f x %.0f x %.0f x [4 x %.0f x ",
          tp - 1, tp, a, rows, d) +
      fmt("(4 x %.0f + 2 x %.0f) + 8 x 3 x %.0f] = %.3f MB (", sum_tb, t, t, n.tp_bytes / 1e6) +
      tb + ")";
  return n;
}

}  // namespace mod::bench
