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
// Every block's capacity fraction, in one pass: 1 when dense; mod.block_capacity[i] for the
// i-th routed block when given, mod.capacity otherwise. Whole vectors, never one block at a
// time: a per-block call would rescan the schedule and make n_layers blocks quadratic.
std::vector<double> capacity_fractions(const modtrain::ModelConfig& cfg);
// C = max(1, round(fraction * seq_len)).
int64_t capacity_tokens(double fraction, int64_t seq_len);
// Every block's capacity_tokens(fraction, cfg.seq_len()): seq_len for a dense block.
std::vector<int64_t> block_capacities(const modtrain::ModelConfig& cfg);

}  // namespace mod::model
