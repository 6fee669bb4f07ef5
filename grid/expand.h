// isoFLOP grid expansion: a GridSpec (configs/grid.proto) -> one RunConfig per (budget, shape,
// variant[, extra seed]), budget-major, then shapes, variants and seeds in spec order. Invariant: a runnable point's
// train.steps is the largest whole number of steps whose training FLOPs fit in the budget,
//   steps = floor(budget / (tokens_per_step x training FLOPs per token)),
// so budget - one step's FLOPs < spent <= budget; training FLOPs per token come from
// model::count_flops (forward + backward = 3 x forward, attention and router included).
// Points whose config is invalid or whose budget buys fewer than min_steps steps are kept in
// the list, marked skipped with the reason, so every command can report them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "configs/grid.pb.h"
#include "model/flops.h"

namespace mod::grid {

struct GridPoint {
  // "b<budget>_<shape>_<variant>", e.g. "b1e13_s2_mod", and "_s<seed>" for an extra seed
  // ("b3e15_d256_mod_s2"): stable across runs
  std::string name;
  int budget_index = 0, shape_index = 0, variant_index = 0;  // into the spec's repeated fields
  // 0: the base seed (base.train.seed); i > 0: extra_seeds[i - 1]
  int seed_index = 0;
  uint64_t seed = 0;  // the point's train.seed, e.g. 1337
  double budget = 0;           // training FLOPs, e.g. 1e13
  std::string budget_label;    // e.g. "1e13"
  std::string shape, variant;  // the spec's labels
  bool routed = false;         // the variant enables MoD
  modtrain::RunConfig config;  // the point's run (train.steps set); meaningful unless skipped
  model::FlopCount flops;      // of config.model(); zero when the config is invalid
  int64_t tokens_per_step = 0;  // batch_size x grad_accum x seq_len
  int64_t steps = 0;            // what the budget buys (also when below min_steps)
  double flops_spent = 0;       // steps x tokens_per_step x training FLOPs per token
  std::string skip_reason;      // empty: runnable
  int array_index = -1;         // position among the runnable points (Slurm array task id)

  bool skipped() const { return !skip_reason.empty(); }
  double flops_per_step() const { return flops.training_per_token * static_cast<double>(tokens_per_step); }
  int64_t tokens() const { return steps * tokens_per_step; }
};

// Whether the spec's extra_seeds apply to budgets[budget_index] (seed_budgets, within 1%).
bool has_extra_seeds(const modtrain::GridSpec& spec, int budget_index);

// The spec must be valid (grid::validate_grid). Never throws for a point: its problems become
// skip reasons.
std::vector<GridPoint> expand(const modtrain::GridSpec& spec);

// A budget as a short, stable label: 6e18 -> "6e18", 2.5e13 -> "2.5e13", 1.25e20 -> "1.25e20"
// (three significant digits at most).
std::string budget_label(double flops);

}  // namespace mod::grid
