// The bound on model sizes that every RunConfig passes wherever it comes from (a config file,
// --set, a grid point, the config inside a weights file or a checkpoint): each size field has a
// ceiling generous for real models, and the parameter count, computed in 64 bits after those
// ceilings so it cannot overflow, is at most kMaxParameters. Nothing is sized before this check.
#pragma once

#include <cstdint>

#include "configs/modtrain.pb.h"

namespace mod::config {

// The ceilings (docs/checkpoints.md "What a loaded file must satisfy" lists them with reasons).
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;         // 16.8M tokens
inline constexpr int64_t kMaxWidth = int64_t{1} << 16;         // d_model, predictor_hidden
inline constexpr int64_t kMaxHidden = int64_t{1} << 20;        // d_ff, moe.d_expert
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
inline constexpr int64_t kMaxExperts = 4096;
inline constexpr int64_t kMaxParameters = int64_t{1} << 40;    // 1.1 trillion

// An upper bound on the trainable parameters: every block counted with the MoE MLP, router and
// predictor the config enables (exact when both schedules cover every block). Call it
// only on a config that passed check_model_size's per-field ceilings.
int64_t parameter_upper_bound(const modtrain::ModelConfig& m);

// Throws std::invalid_argument "config: <field>: <value> must be at most <ceiling> ..." for the
// first size above its ceiling, then for a parameter bound above kMaxParameters. Sizes must
// already be positive (validate checks that first).
void check_model_size(const modtrain::ModelConfig& m);

}  // namespace mod::config
