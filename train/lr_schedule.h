// The learning-rate schedule: linear warm-up, then cosine decay (optimizer.lr, warmup_steps,
// min_lr).
#pragma once

#include <cstdint>

#include "configs/modtrain.pb.h"

namespace mod::train {

// Linear warm-up from lr/warmup to lr over warmup_steps, then cosine decay to min_lr at
// total_steps. step is 0-based.
double learning_rate(const modtrain::OptimizerConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace mod::train
