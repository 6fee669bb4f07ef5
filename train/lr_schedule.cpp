// The learning-rate schedule (see lr_schedule.h).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mod::train {

double learning_rate(const modtrain::OptimizerConfig& cfg, int64_t step, int64_t total_steps) {
  const int64_t warmup = cfg.warmup_steps();
  if (step < warmup) return cfg.lr() * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const double span = std::max<int64_t>(1, total_steps - warmup);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
  return cfg.min_lr() +
         0.5 * (cfg.lr() - cfg.min_lr()) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace mod::train
