// The MoD routing schedule and capacity rule, read by the model, the FLOP accounting and the
// parallel and grid code alike: which blocks are routed (model.mod's schedule: every other block
// from the second by default, every block, every k-th, or an explicit list), which blocks have an
// MoE MLP (model.moe's schedule, same meanings), and each routed block's capacity
// C = max(1, round(fraction * seq_len)) tokens per sequence (docs/architecture.md section 3).
#pragma once

#include <cstdint>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::model {

// Which blocks are routed (all false when model.mod is off).
std::vector<bool> routed_blocks(const modtrain::ModelConfig& cfg);
// Which blocks have an MoE MLP (all false when model.moe is off).
std::vector<bool> moe_blocks(const modtrain::ModelConfig& cfg);
// A block's capacity fraction: 1 when dense; mod.block_capacity[i] for the i-th routed block
// when given, mod.capacity otherwise.
double capacity_fraction(const modtrain::ModelConfig& cfg, int block);
// C = max(1, round(fraction * seq_len)).
int64_t capacity_tokens(double fraction, int64_t seq_len);
// capacity_tokens(capacity_fraction(cfg, block), cfg.seq_len()).
int64_t block_capacity(const modtrain::ModelConfig& cfg, int block);

}  // namespace mod::model
