// Which tokens each expert takes: the selections of an MoE layer, computed where the router
// probabilities are (Backend::moe_select; a selection has no gradient), so a step on a GPU
// never waits for the host. Every sequence gets the same number of slots K per expert, so
// tensor shapes never depend on the data; routing never looks across the batch, so a dp rank's
// rows route exactly as they would in one process.
//
// Shapes: B sequences, T tokens entering the layer, E real experts, E' = E (+1 no-op expert).
#pragma once

#include <cstdint>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/tensor.h"

namespace mod::model {

// One layer's selection on probs' device (Backend::moe_select has the layouts).
struct MoeSelection {
  int64_t batch = 0, tokens = 0, experts = 0, k = 0;  // B, T, E, K
  Tensor rows, gate_rows;  // [E*B*K] i64
  Tensor valid;            // [E*B*K] probs' dtype: 0 for an empty token-choice slot
  Tensor share;            // [B,E] (f32 for bf16 probs): token choice's first-choice shares
  Tensor counts;           // [B,2] f64: unrouted tokens, dropped choices, per sequence
  bool all_valid = true;   // expert choice fills every slot
  double noop_fraction = 0;
};
MoeSelection select_experts(const Tensor& probs, const modtrain::MoEConfig& cfg);

// A selection's statistics over all B * T tokens, from its counts and shares (copied to the
// host here): tokens no real expert took; under token choice also the dropped share of the
// T * top_k choices and max_e of E * (expert e's share of the first choices).
struct SelectionStats {
  double unrouted_fraction = 0, dropped_fraction = 0, max_load = 0;
};
SelectionStats selection_stats(const Tensor& counts, const Tensor& share, int64_t tokens,
                               int64_t top_k, bool token_choice);

// A selection read back to the host (tests, and the rules spelled out).
// Slot tables, expert-major: entry (e, b, j) at (e * B + b) * K + j.
struct ExpertSlots {
  int64_t batch = 0, tokens = 0, experts = 0, k = 0;  // B, T, E, K
  std::vector<int64_t> token;  // position in its sequence (0 for an empty slot)
  std::vector<uint8_t> valid;  // 0: an empty slot (token choice under capacity); gate 0
  bool all_valid = true;
  // Statistics of the selection, over all B * T tokens.
  double unrouted_fraction = 0;  // tokens no real expert took (no-op tokens included)
  double noop_fraction = 0;      // tokens the no-op expert took
  double dropped_fraction = 0;   // token choice: choices lost to full experts
  double max_load = 0;           // token choice: max_e of E * (share of first choices on e)
  std::vector<double> first_choice_share;  // token choice: [B * E], per sequence (balance loss)
};

// Tokens the no-op expert takes from t tokens (0 without one).
int64_t noop_tokens(const modtrain::MoEConfig& cfg, int64_t t);
// Slots per (sequence, expert) for t tokens entering the layer.
//   expert choice: clamp(round(capacity_factor * (t - noop) / E), 1, t - noop) (0 if noop = t)
//   token choice:  clamp(round(capacity_factor * top_k * t / E), 1, t)
int64_t expert_slots(const modtrain::MoEConfig& cfg, int64_t t);

// probs [B,T,E'] (softmax over E' router logits; the no-op expert is the last column).
// The no-op expert first takes its noop_tokens(T) highest-scoring tokens, which leave the pool;
// each real expert then takes the k highest-scoring remaining tokens of each sequence (score
// descending, ties to the lower position), listed in ascending position.
ExpertSlots expert_choice(const Tensor& probs, const modtrain::MoEConfig& cfg);

// probs [B,T,E]. Each token ranks experts by probability (ties to the lower expert); first
// choices are placed in position order, then second choices (top_k = 2); a choice that finds
// its expert's K slots full is dropped.
ExpertSlots token_choice(const Tensor& probs, const modtrain::MoEConfig& cfg);

}  // namespace mod::model
