// Grid expansion (see expand.h).
#include "grid/expand.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

#include "configs/config.h"

namespace mod::grid {

std::string budget_label(double flops) {
  int exponent = static_cast<int>(std::floor(std::log10(flops)));
  double mantissa = flops / std::pow(10.0, exponent);
  mantissa = std::round(mantissa * 100.0) / 100.0;  // three significant digits
  if (mantissa >= 10.0) {
    mantissa /= 10.0;
    ++exponent;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ge%d", mantissa, exponent);
  return buf;
}

namespace {

// Steps whose FLOPs fit in the budget, exactly: the division may round either way.
int64_t steps_within(double budget, double per_step) {
  const double q = std::floor(budget / per_step);
  if (q >= static_cast<double>(std::numeric_limits<int64_t>::max() / 2)) return std::numeric_limits<int64_t>::max() / 2;
  int64_t steps = static_cast<int64_t>(q);
  while (steps > 0 && static_cast<double>(steps) * per_step > budget) --steps;
  while (static_cast<double>(steps + 1) * per_step <= budget) ++steps;
  return steps;
}

std::string strip_prefix(const std::string& e) {
  return e.rfind("config: ", 0) == 0 ? e.substr(8) : e;
}

void build_point(const modtrain::GridSpec& spec, GridPoint& p) {
  const auto& shape = spec.shapes(p.shape_index);
  const auto& variant = spec.variants(p.variant_index);
  modtrain::RunConfig& cfg = p.config;
  cfg = spec.base();
  cfg.set_name(p.name);
  cfg.mutable_train()->set_seed(p.seed);
  auto* m = cfg.mutable_model();
  m->set_d_model(shape.d_model());
  m->set_n_layers(shape.n_layers());
  m->set_n_heads(shape.n_heads());
  m->set_d_ff(shape.d_ff());
  if (variant.has_mod())
    *m->mutable_mod() = variant.mod();
  else
    m->clear_mod();
  if (variant.has_moe())
    *m->mutable_moe() = variant.moe();
  else
    m->clear_moe();
  cfg.mutable_train()->set_steps(1);  // a placeholder until the FLOPs are known
  try {
    for (const auto& o : shape.overrides()) config::apply_override(cfg, o);
    for (const auto& o : variant.overrides()) config::apply_override(cfg, o);
    config::validate(cfg);
  } catch (const std::invalid_argument& e) {
    p.skip_reason = "invalid config: " + strip_prefix(e.what());
    return;
  }
  p.routed = cfg.model().mod().enabled();
  p.flops = model::count_flops(cfg.model());
  const auto& t = cfg.train();
  p.tokens_per_step = static_cast<int64_t>(t.batch_size()) * t.grad_accum() * cfg.model().seq_len();
  p.steps = steps_within(p.budget, p.flops_per_step());
  p.flops_spent = static_cast<double>(p.steps) * p.flops_per_step();
  char buf[256];
  if (p.steps < spec.min_steps()) {
    std::snprintf(buf, sizeof buf, "the budget buys %lld steps of %.3g FLOPs, fewer than min_steps %d",
                  static_cast<long long>(p.steps), p.flops_per_step(), spec.min_steps());
    p.skip_reason = buf;
    return;
  }
  if (p.steps > std::numeric_limits<int32_t>::max()) {
    std::snprintf(buf, sizeof buf, "the budget buys %lld steps, more than train.steps can hold",
                  static_cast<long long>(p.steps));
    p.skip_reason = buf;
    return;
  }
  cfg.mutable_train()->set_steps(static_cast<int32_t>(p.steps));
  if (spec.warmup_fraction() > 0)
    cfg.mutable_optimizer()->set_warmup_steps(
        static_cast<int32_t>(std::llround(spec.warmup_fraction() * static_cast<double>(p.steps))));
  try {
    config::validate(cfg);
  } catch (const std::invalid_argument& e) {
    p.skip_reason = "invalid config: " + strip_prefix(e.what());
  }
}

}  // namespace

bool has_extra_seeds(const modtrain::GridSpec& spec, int budget_index) {
  if (spec.extra_seeds_size() == 0) return false;
  if (spec.seed_budgets_size() == 0) return true;
  const double budget = spec.budgets(budget_index);
  for (double b : spec.seed_budgets())
    if (std::abs(b - budget) <= 0.01 * budget) return true;  // as grid/spec.cpp checks them
  return false;
}

std::vector<GridPoint> expand(const modtrain::GridSpec& spec) {
  std::vector<GridPoint> points;
  int runnable = 0;
  for (int b = 0; b < spec.budgets_size(); ++b) {
    const int seeds = has_extra_seeds(spec, b) ? 1 + spec.extra_seeds_size() : 1;
    for (int s = 0; s < spec.shapes_size(); ++s)
      for (int v = 0; v < spec.variants_size(); ++v)
        for (int k = 0; k < seeds; ++k) {
          GridPoint p;
          p.budget_index = b;
          p.shape_index = s;
          p.variant_index = v;
          p.seed_index = k;
          p.seed = k == 0 ? spec.base().train().seed() : spec.extra_seeds(k - 1);
          p.budget = spec.budgets(b);
          p.budget_label = budget_label(p.budget);
          p.shape = spec.shapes(s).name();
          p.variant = spec.variants(v).name();
          p.name = "b" + p.budget_label + "_" + p.shape + "_" + p.variant;
          if (k > 0) p.name += "_s" + std::to_string(p.seed);
          build_point(spec, p);
          if (!p.skipped()) p.array_index = runnable++;
          points.push_back(std::move(p));
        }
  }
  return points;
}

}  // namespace mod::grid
