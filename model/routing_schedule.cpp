// Which blocks are routed or carry an MoE MLP, and the MoD capacity rule (see routing_schedule.h).
#include "model/routing_schedule.h"

#include <algorithm>
#include <cmath>

namespace mod::model {

namespace {
// Blocks picked by a schedule (MoDConfig's meaning, shared by MoD routing and MoE MLPs).
std::vector<bool> scheduled_blocks(int n, modtrain::MoDConfig::Schedule schedule, int every_k,
                                   const google::protobuf::RepeatedField<int32_t>& list) {
  std::vector<bool> on(n, false);
  switch (schedule) {
    case modtrain::MoDConfig::EVERY_OTHER:
      for (int i = 1; i < n; i += 2) on[i] = true;
      break;
    case modtrain::MoDConfig::EVERY:
      for (int i = 0; i < n; ++i) on[i] = true;
      break;
    case modtrain::MoDConfig::EVERY_KTH:
      for (int i = every_k - 1; i < n; i += every_k) on[i] = true;
      break;
    case modtrain::MoDConfig::EXPLICIT:
      for (int b : list) on[b] = true;
      break;
  }
  return on;
}
}  // namespace

std::vector<bool> routed_blocks(const modtrain::ModelConfig& cfg) {
  const auto& m = cfg.mod();
  if (!m.enabled()) return std::vector<bool>(cfg.n_layers(), false);
  return scheduled_blocks(cfg.n_layers(), m.schedule(), m.every_k(), m.routed_blocks());
}

std::vector<bool> moe_blocks(const modtrain::ModelConfig& cfg) {
  const auto& m = cfg.moe();
  if (!m.enabled()) return std::vector<bool>(cfg.n_layers(), false);
  return scheduled_blocks(cfg.n_layers(), m.schedule(), m.every_k(), m.moe_blocks());
}

std::vector<double> capacity_fractions(const modtrain::ModelConfig& cfg) {
  const auto routed = routed_blocks(cfg);
  const auto& m = cfg.mod();
  std::vector<double> out(routed.size(), 1.0);
  int ordinal = 0;  // the block's index among routed blocks, for block_capacity
  for (size_t b = 0; b < routed.size(); ++b)
    if (routed[b]) {
      out[b] = ordinal < m.block_capacity_size() ? m.block_capacity(ordinal) : m.capacity();
      ++ordinal;
    }
  return out;
}

int64_t capacity_tokens(double fraction, int64_t seq_len) {
  return std::max<int64_t>(1, std::llround(fraction * static_cast<double>(seq_len)));
}

std::vector<int64_t> block_capacities(const modtrain::ModelConfig& cfg) {
  std::vector<int64_t> out;
  for (double f : capacity_fractions(cfg)) out.push_back(capacity_tokens(f, cfg.seq_len()));
  return out;
}

}  // namespace mod::model
