// The range of every float field of RunConfig, one row per field: a value outside its range
// (NaN and infinities included) is an error naming the field, the value and the range. Ranges
// are generous for real runs and leave out values that only make NaN later (a 1e308 learning
// rate, a subnormal rope_theta). Bounds that depend on another field (min_lr <= lr,
// capacity_factor <= n_experts, lr * weight_decay <= 1) are validate()'s.
#pragma once

#include <string>

#include "configs/modtrain.pb.h"

namespace mod::config {

struct FloatRange {
  const char* field;  // path from RunConfig; a repeated field's row covers every element
  double lo, hi;
  bool lo_open, hi_open;  // (lo, ...] when lo_open, [..., hi) when hi_open
};

// One row per float field of the schema (tests/configs/config_test.cpp checks both ways).
inline constexpr FloatRange kFloatRanges[] = {
    {"model.rope_theta", 1, 1e12, false, false},
    {"model.norm_eps", 1e-12, 1, false, false},
    {"model.init_std", 0, 1, true, false},
    {"model.mod.capacity", 0, 1, true, false},
    {"model.mod.block_capacity", 0, 1, true, false},
    {"model.mod.causal.aux_weight", 0, 1000, false, false},
    {"model.mod.causal.predictor_weight", 0, 1000, false, false},
    {"model.mod.causal.predictor_grad_clip", 0, 1e6, false, false},
    {"model.moe.capacity_factor", 0, 4096, true, false},
    {"model.moe.balance_weight", 0, 1000, false, false},
    {"model.moe.z_weight", 0, 1000, false, false},
    {"model.moe.noop_capacity", 0, 1, false, false},
    {"optimizer.lr", 0, 10, true, false},
    {"optimizer.min_lr", 0, 10, false, false},
    {"optimizer.weight_decay", 0, 10, false, false},
    {"optimizer.beta1", 0, 1, false, true},
    {"optimizer.beta2", 0, 1, false, true},
    {"optimizer.eps", 1e-30, 1, false, false},
    {"optimizer.grad_clip", 0, 1e6, false, false},
    {"parallel.bucket_mb", 0, 65536, true, false},
    {"checkpoint.every_minutes", 0, 1e6, false, false},
};

// "(0, 10]", "[1e-12, 1]".
std::string range_text(const FloatRange& r);

// Every float field of cfg, set or default, against its row. model.moe's fields are held to
// their ranges only while model.moe.enabled (they are unused otherwise) but must be finite.
// Throws std::invalid_argument "config: <field>: <value> must be ..."; std::logic_error when a
// float field has no row.
void check_float_ranges(const modtrain::RunConfig& cfg);

}  // namespace mod::config
