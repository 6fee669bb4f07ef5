// Small model configs and tensor helpers for model tests: vocabulary 32, width 16, 2 heads, 2 blocks (block 1
// routed when MoD is on), sequences of 12 tokens, capacity 0.25 (C = 3). tiny_moe adds an
// expert-choice MoE MLP to every block (4 experts of width 32, k = 12 / 4 = 3 slots each).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mod::test {

// pos [B,T] i64 = 0..T-1 in every row.
inline Tensor arange_positions(int64_t b, int64_t t) {
  std::vector<int64_t> p(b * t);
  for (int64_t i = 0; i < b * t; ++i) p[i] = i % t;
  return Tensor::from_indices(p, {b, t});
}

// tokens [B,T] i64 uniform in [0, vocab), the same for the same seed.
inline Tensor tokens_for(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids(b * t);
  for (auto& i : ids) i = rng.below(vocab);
  return Tensor::from_indices(ids, {b, t});
}

// The largest elementwise |a - b|.
inline double max_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.at(i) - b.at(i)));
  return m;
}

inline modtrain::ModelConfig tiny_model(bool mod) {
  modtrain::ModelConfig m;
  m.set_vocab_size(32);
  m.set_d_model(16);
  m.set_n_layers(2);
  m.set_n_heads(2);
  m.set_d_ff(32);
  m.set_seq_len(12);
  m.set_init_std(0.3);  // large enough that routing decisions and logits vary
  m.mutable_mod()->set_enabled(mod);
  m.mutable_mod()->set_capacity(0.25);
  m.mutable_mod()->mutable_causal()->set_predictor_hidden(8);
  return m;
}

// tiny_model(mod) with an MoE MLP in every block: staged MoDE when mod is on; integrated MoDE
// (a no-op expert taking half of each sequence) with noop_expert.
inline modtrain::ModelConfig tiny_moe(bool mod, bool noop_expert = false) {
  modtrain::ModelConfig m = tiny_model(mod);
  auto* e = m.mutable_moe();
  e->set_enabled(true);
  e->set_n_experts(4);
  e->set_routing(modtrain::MoEConfig::EXPERT_CHOICE);
  e->set_capacity_factor(1.0);
  e->set_schedule(modtrain::MoDConfig::EVERY);
  e->set_noop_expert(noop_expert);
  e->set_noop_capacity(0.5);
  return m;
}

}  // namespace mod::test
