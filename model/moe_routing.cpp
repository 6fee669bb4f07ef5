// MoE selections (see moe_routing.h).
#include "model/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/backend.h"

namespace mod::model {

namespace {
void check_probs(const Tensor& probs, int64_t experts, const char* what) {
  if (probs.dim() != 3 || probs.size(2) != experts)
    throw std::invalid_argument(std::string(what) + ": router probabilities " + describe(probs) +
                                " must be [B,T," + std::to_string(experts) + "]");
}

// The selection on the host: slots' tokens and the statistics over all B * T tokens.
ExpertSlots read_back(const MoeSelection& sel, int64_t top_k) {
  ExpertSlots s;
  s.batch = sel.batch;
  s.tokens = sel.tokens;
  s.experts = sel.experts;
  s.k = sel.k;
  s.all_valid = sel.all_valid;
  s.noop_fraction = sel.noop_fraction;
  const int64_t b = sel.batch, t = sel.tokens, e = sel.experts, n = e * b * sel.k;
  const Tensor rows = sel.rows.to(Device::CPU), valid = sel.valid.to(Device::CPU).to(DType::F64);
  s.token.resize(n);
  s.valid.resize(n);
  for (int64_t slot = 0; slot < n; ++slot) {
    const int64_t r = slot / sel.k % b;
    s.token[slot] = rows.data<int64_t>()[slot] - r * t;
    s.valid[slot] = valid.data<double>()[slot] != 0 ? 1 : 0;
  }
  const SelectionStats st = selection_stats(sel.counts, sel.share, t, top_k, !sel.all_valid);
  s.unrouted_fraction = st.unrouted_fraction;
  s.dropped_fraction = st.dropped_fraction;
  s.max_load = st.max_load;
  if (!sel.all_valid) {
    const Tensor share = sel.share.to(Device::CPU).to(DType::F64);
    s.first_choice_share.assign(share.data<double>(), share.data<double>() + b * e);
  }
  return s;
}
}  // namespace

SelectionStats selection_stats(const Tensor& counts_in, const Tensor& share_in, int64_t tokens,
                               int64_t top_k, bool token_choice) {
  SelectionStats st;
  const Tensor counts = counts_in.to(Device::CPU);
  const int64_t b = counts.size(0);
  double unrouted = 0, dropped = 0;
  for (int64_t r = 0; r < b; ++r) {
    unrouted += counts.data<double>()[r * 2];
    dropped += counts.data<double>()[r * 2 + 1];
  }
  const double all = static_cast<double>(b * tokens);
  st.unrouted_fraction = unrouted / all;
  if (!token_choice) return st;
  st.dropped_fraction = dropped / (all * static_cast<double>(top_k));
  const Tensor share = share_in.to(Device::CPU).to(DType::F64);
  const int64_t e = share.size(1);
  for (int64_t ei = 0; ei < e; ++ei) {
    double total = 0;
    for (int64_t r = 0; r < b; ++r) total += share.data<double>()[r * e + ei];
    st.max_load = std::max(st.max_load, total * static_cast<double>(e) / static_cast<double>(b));
  }
  return st;
}

int64_t noop_tokens(const modtrain::MoEConfig& cfg, int64_t t) {
  if (!cfg.noop_expert()) return 0;
  return std::clamp<int64_t>(std::llround(cfg.noop_capacity() * static_cast<double>(t)), 0, t);
}

int64_t expert_slots(const modtrain::MoEConfig& cfg, int64_t t) {
  const double e = cfg.n_experts();
  if (cfg.routing() == modtrain::MoEConfig::TOKEN_CHOICE)
    return std::clamp<int64_t>(std::llround(cfg.capacity_factor() * cfg.top_k() * t / e), 1, t);
  const int64_t pool = t - noop_tokens(cfg, t);
  if (pool == 0) return 0;
  return std::clamp<int64_t>(std::llround(cfg.capacity_factor() * pool / e), 1, pool);
}

MoeSelection select_experts(const Tensor& probs, const modtrain::MoEConfig& cfg) {
  const bool token = cfg.routing() == modtrain::MoEConfig::TOKEN_CHOICE;
  const int64_t e_real = cfg.n_experts(), e_all = e_real + (!token && cfg.noop_expert() ? 1 : 0);
  check_probs(probs, e_all, token ? "token_choice" : "expert_choice");
  MoeSelectArgs a;
  a.token_choice = token;
  a.experts = e_real;
  const int64_t b = probs.size(0), t = probs.size(1);
  a.noop = token ? 0 : noop_tokens(cfg, t);
  a.k = expert_slots(cfg, t);
  a.top_k = token ? cfg.top_k() : 1;
  MoeSelection sel;
  sel.batch = b;
  sel.tokens = t;
  sel.experts = e_real;
  sel.k = a.k;
  sel.all_valid = !token;
  sel.noop_fraction = static_cast<double>(a.noop) / static_cast<double>(t);
  const Device device = probs.device();
  const int64_t n = e_real * b * a.k;
  sel.rows = Tensor::empty({n}, DType::I64, device);
  sel.gate_rows = Tensor::empty({n}, DType::I64, device);
  sel.valid = Tensor::empty({n}, probs.dtype(), device);
  const DType share_dtype = probs.dtype() == DType::BF16 ? DType::F32 : probs.dtype();
  sel.share = Tensor::empty({b, e_real}, share_dtype, device);
  sel.counts = Tensor::empty({b, 2}, DType::F64, device);
  backend_of(probs).moe_select(probs, a, sel.rows, sel.gate_rows, sel.valid, sel.share, sel.counts);
  return sel;
}

ExpertSlots expert_choice(const Tensor& probs, const modtrain::MoEConfig& cfg) {
  if (cfg.routing() != modtrain::MoEConfig::EXPERT_CHOICE)
    throw std::invalid_argument("expert_choice: the config routes by token choice");
  return read_back(select_experts(probs, cfg), 1);
}

ExpertSlots token_choice(const Tensor& probs, const modtrain::MoEConfig& cfg) {
  if (cfg.routing() != modtrain::MoEConfig::TOKEN_CHOICE)
    throw std::invalid_argument("token_choice: the config routes by expert choice");
  return read_back(select_experts(probs, cfg), cfg.top_k());
}

}  // namespace mod::model
