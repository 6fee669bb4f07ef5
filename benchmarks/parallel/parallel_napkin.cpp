// The layouts and the napkin minimum of parallel_bench (see parallel_napkin.h).
#include "benchmarks/parallel/parallel_napkin.h"

#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "model/flops.h"
#include "model/parameter_shapes.h"
#include "model/moe_routing.h"
#include "model/routing_schedule.h"

namespace mod::bench {

std::string Layout::label() const {
  std::string s;
  auto add = [&](const char* name, int n) {
    s += (s.empty() ? "" : "x") + std::string(name) + std::to_string(n);
  };
  if (dp > 1 || (tp == 1 && pp == 1)) add("dp", dp);
  if (tp > 1) add("tp", tp);
  if (pp > 1) add("pp", pp);
  return s + (ep > 1 ? "+ep" + std::to_string(ep) : "") +
         (zero_stage > 0 ? "+zero" + std::to_string(zero_stage) : "") + (sp ? "+sp" : "") +
         (v > 1 ? "+v" + std::to_string(v) : "");
}

namespace {
// "dp2" -> 2 for name "dp"; false unless the name, then a positive decimal.
bool factor(const std::string& part, const char* name, int& value) {
  const size_t n = std::strlen(name);
  if (part.rfind(name, 0) != 0 || part.size() <= n) return false;
  const std::string digits = part.substr(n);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6)
    return false;
  value = std::stoi(digits);
  return value >= 1;
}
}  // namespace

Layout parse_layout(const std::string& text) {
  const std::string usage =
      "layout '" + text + "': expected dpN, tpN, ppN or a product (dpNxtpMxppK), then +epK, "
      "+zero1, +zero2, +zero3, +sp or +vK";
  Layout l;
  std::stringstream items(text);
  std::string item;
  std::getline(items, item, '+');
  std::stringstream parts(item);
  std::string part;
  bool any = false;
  while (std::getline(parts, part, 'x')) {
    if (!factor(part, "dp", l.dp) && !factor(part, "tp", l.tp) && !factor(part, "pp", l.pp))
      throw std::invalid_argument(usage);
    any = true;
  }
  if (!any || text.back() == '+') throw std::invalid_argument(usage);
  while (std::getline(items, item, '+')) {
    if (item == "zero1" || item == "zero2" || item == "zero3")
      l.zero_stage = item.back() - '0';
    else if (item == "sp")
      l.sp = true;
    else if (!factor(item, "ep", l.ep) && !factor(item, "v", l.v))
      throw std::invalid_argument(usage + " (not '+" + item + "')");
  }
  if (l.v > 1 && l.pp == 1)
    throw std::invalid_argument(usage + " (+v" + std::to_string(l.v) + " needs ppN)");
  return l;
}

std::vector<Layout> default_layouts(int n, bool experts) {
  std::vector<Layout> out;
  if (n == 1) return {{1, 1, 1, false}};
  if (n == 2) {
    out = {{2, 1, 1, false}, {1, 2, 1, false}, {2, 1, 1, true}};
    if (experts) out.push_back({2, 1, 2, false});
  } else if (n == 4) {
    out = {{2, 2, 1, false}, {4, 1, 1, false}, {1, 4, 1, false}};
    if (experts) out.insert(out.end(), {{2, 2, 2, false}, {4, 1, 2, false}});
  } else {
    out = {{n, 1, 1, false}, {n, 1, 1, true}};
  }
  return out;
}

bool tp_split_parameter(const std::string& name) {
  if (name == "embed.weight" || name == "lm_head.weight") return true;
  for (const char* w : {".attn.wq.weight", ".attn.wk.weight", ".attn.wv.weight", ".attn.wo.weight",
                        ".mlp.up.weight", ".mlp.gate.weight", ".mlp.down.weight"}) {
    const std::string suffix = w;
    if (name.size() >= suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  }
  return false;
}

int block_of_parameter(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return -1;
  return std::stoi(name.substr(7));
}

bool seq_partial_parameter(const std::string& name, const std::vector<bool>& routed_block) {
  if (tp_split_parameter(name) || name.find(".mlp.experts.") != std::string::npos) return false;
  const int blk = block_of_parameter(name);
  return !(blk >= 0 && routed_block[blk] && name.compare(name.find('.', 7) + 1, 4, "norm") == 0);
}

std::string fmt(const char* format, double a, double b, double c, double d, double e, double f) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, a, b, c, d, e, f);
  return buf;
}

std::vector<int64_t> expert_slots_by_block(const modtrain::ModelConfig& m) {
  const auto moe = model::moe_blocks(m);
  const auto capacities = model::block_capacities(m);
  std::vector<int64_t> k(m.n_layers(), 0);
  for (int blk = 0; blk < m.n_layers(); ++blk)
    if (moe[blk]) k[blk] = model::expert_slots(m.moe(), capacities[blk]);
  return k;
}

Napkin napkin(const modtrain::RunConfig& cfg, const Layout& l, double valid_share) {
  const auto& m = cfg.model();
  const int64_t d = m.d_model(), f = m.d_ff(), v = m.vocab_size(), layers = m.n_layers();
  const int64_t t = m.seq_len(), b = cfg.train().batch_size(), a = cfg.train().grad_accum();
  const int mlp_mats = m.mlp() == modtrain::ModelConfig::SWIGLU ? 3 : 2;
  const int64_t e = m.moe().n_experts(), fe = m.moe().d_expert() > 0 ? m.moe().d_expert() : f;
  const auto moe = model::moe_blocks(m);
  const auto slots = expert_slots_by_block(m);
  int64_t n_moe = 0;
  for (bool x : moe) n_moe += x;

  Napkin n;
  n.params = model::count_flops(m).parameters;
  n.split = layers * 4 * d * d + (layers - n_moe) * mlp_mats * d * f +
            v * d * (m.tie_embeddings() ? 1 : 2);
  n.expert = n_moe * e * mlp_mats * d * fe;
  n.replicated = n.params - n.split - n.expert;
  // ZeRO-3's outer unit and sequence parallelism's partial parameters, by name as
  // parallel/parallelize.cpp picks them (a routed block's norms see its gathered rows, whole).
  const auto routed_block = model::routed_blocks(m);
  for (const auto& [name, shape] : model::parameter_shapes(m)) {
    int64_t numel = 1;
    for (int64_t x : shape) numel *= x;
    const int blk = block_of_parameter(name);
    if (blk < 0) n.outer += numel;
    if (seq_partial_parameter(name, routed_block)) n.seq_partial += numel;
  }
  n.local = static_cast<double>(n.split) / l.tp + static_cast<double>(n.replicated);
  n.expert_local = static_cast<double>(n.expert) / l.ep;
  n.edp = l.dp / l.ep * l.tp;
  n.valid_share = valid_share;
  n.params_formula =
      fmt("P_local = P_split / tp + P_replicated = %.0f / %.0f + %.0f = %.0f",
          static_cast<double>(n.split), l.tp, static_cast<double>(n.replicated), n.local);

  // dp: dense gradients (and ZeRO-1's all-gather of updated dense parameters).
  const double dp = l.dp, tp = l.tp, ep = l.ep, edp = n.edp;
  n.dp_bytes = 2 * (dp - 1) / dp * 4 * n.local;  // ZeRO-1: reduce-scatter + all-gather, as much
  n.dp_formula = l.sharded() ? fmt("(1 + 1)(dp - 1) / dp x 4 B x P_local = 2 x %.0f / %.0f x 4 x %.0f "
                               "= %.3f MB (reduce-scatter + all-gather)",
                               dp - 1, dp, n.local, n.dp_bytes / 1e6)
                         : fmt("2 (dp - 1) / dp x 4 B x P_local = 2 x %.0f / %.0f x 4 x %.0f = "
                               "%.3f MB",
                               dp - 1, dp, n.local, n.dp_bytes / 1e6);
  if (l.stage3()) {  // tp 1 and no experts (config::validate): P_local = P
    const double blocks = static_cast<double>(n.params - n.outer);
    n.dp_bytes = (dp - 1) / dp * 4 * (n.local + a * n.local + a * blocks);
    n.dp_formula =
        fmt("(dp - 1) / dp x 4 B x (P + a x P + a x P_blocks) = %.0f / %.0f x 4 x (%.0f + %.0f x ",
            dp - 1, dp, n.local, a) +
        fmt("%.0f + %.0f x %.0f) = %.3f MB (ZeRO-3: the reduce-scatter once a step; each "
            "micro-batch all-gathers every unit in forward and every block again in backward, "
            "the outer unit staying whole)",
            n.local, a, blocks, n.dp_bytes / 1e6);
  }

  // edp: expert gradients over the ranks holding the same experts (summed there, divided by dp).
  n.edp_bytes = 2 * (edp - 1) / edp * 4 * n.expert_local;
  n.edp_formula =
      std::string(l.sharded() ? "(1 + 1)" : "2") +
      fmt(" (edp - 1) / edp x 4 B x P_expert / ep = %.0f x %.0f / %.0f x 4 x %.0f / %.0f = %.3f MB",
          2.0, edp - 1, edp, static_cast<double>(n.expert), ep,
          n.edp_bytes / 1e6) +
      fmt(", edp = dp / ep x tp = %.0f / %.0f x %.0f = %.0f", dp, ep, tp, edp) +
      (l.sharded() ? " (reduce-scatter + all-gather)" : "");

  // tp: per block, attention 2 all-reduces of [B/dp, T_b, D]; a dense MLP 2 more; an MoE MLP
  // 2 all-gathers of its [E, B/dp x K_b, D] slots (combine forward, dispatch backward).
  int64_t sum_w = 0, sum_ek = 0, routed = 0, c = t;
  const auto capacities = model::block_capacities(m);
  for (int blk = 0; blk < layers; ++blk) {
    const int64_t tb = capacities[blk];
    sum_w += moe[blk] ? 2 * tb + e * slots[blk] : 4 * tb;
    // Sequence parallelism: a routed block's rows gathered (forward) and their gradient
    // scattered (backward), one all-reduce of [b, C, D] each way.
    if (l.sp && routed_block[blk]) sum_w += 2 * tb;
    sum_ek += e * slots[blk];
    if (routed_block[blk]) {
      ++routed;
      c = tb;
    }
  }
  const double rows = static_cast<double>(b) / dp;
  // The loss: an all-gather of each slice's logsumexp (tp x T values) and an all-reduce of
  // the target logit (T values), written in the all-reduce's 2 (tp - 1) / tp units.
  const double inner = 4.0 * d * (sum_w + 2.0 * t) + 4.0 * t * (tp / 2 + 1);
  const double activations = 2 * (tp - 1) / tp * a * rows * inner;
  // Sequence parallelism: the partial gradients summed over tp once a step.
  const double seq_grads = l.sp ? 2 * (tp - 1) / tp * 4 * static_cast<double>(n.seq_partial) : 0;
  n.tp_bytes = activations + seq_grads;
  std::string w = n_moe < layers ? "4 T_b per dense-MLP block" : "";
  if (n_moe > 0)
    w += (w.empty() ? "" : ", ") +
         fmt("2 T_b + E K_b per MoE block (%.0f of them, sum E K_b = %.0f)", n_moe,
             static_cast<double>(sum_ek));
  w += routed == 0 ? fmt("; T_b = %.0f", t) : fmt("; T_b = %.0f or C %.0f", t, c);
  if (l.sp && routed > 0) w += "; sequence parallel: + 2 C per routed block, its rows";
  n.tp_formula =
      fmt("2 (tp - 1) / tp x a x B / dp x [4 B x D x (sum_b w_b + 2 T) + 4 B x T x (tp / 2 + 1)] = "
          "2 x %.0f / "
          "%.0f x %.0f x %.0f x [4 x %.0f x ",
          tp - 1, tp, a, rows, d) +
      fmt("(%.0f + 2 x %.0f) + 4 x %.0f x (%.0f / 2 + 1)] = %.3f MB (w_b = ", sum_w, t, t, tp,
          activations / 1e6) +
      w + ")" +
      (l.sp ? fmt("; sequence parallel: an all-gather + reduce-scatter for each all-reduce, the "
                  "same bytes, + 2 (tp - 1) / tp x 4 B x P_seq = %.3f MB (P_seq = %.0f partial "
                  "gradients; MoD's scores, predictor logits and causal loss, 4 B x T a "
                  "sequence each, left out)",
                  seq_grads / 1e6, static_cast<double>(n.seq_partial))
            : std::string());

  // ep: per MoE block 4 all-to-alls (dispatch, combine; forward, backward) of [E, B/dp x K_b / tp,
  // D]; (ep - 1) / ep of the slots go to experts on other ranks.
  n.ep_slot_bytes = 4 * (ep - 1) / ep * a * 4 * d * rows / tp * sum_ek;
  n.ep_bytes = valid_share * n.ep_slot_bytes;
  n.ep_formula =
      fmt("valid x 4 x (ep - 1) / ep x a x 4 B x D x B / dp / tp x sum_b E K_b = %.3f x 4 x %.0f / "
          "%.0f x %.0f x 4 x %.0f x ",
          valid_share, ep - 1, ep, a, d) +
      fmt("%.0f / %.0f x %.0f = %.3f MB (4 all-to-alls per MoE block", rows, tp, sum_ek,
          n.ep_bytes / 1e6) +
      (valid_share < 1 ? fmt("; the static slots send %.3f MB)", n.ep_slot_bytes / 1e6)
                       : std::string(")"));
  return n;
}

}  // namespace mod::bench
