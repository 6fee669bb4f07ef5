// mode_bench: training-step time of dense, MoD, MoE and MoDE recipes in one process, next to
// the active FLOPs each spends per token (count_flops: attention and MLPs on the tokens that
// enter them, routers, predictors, and each MoE layer's experts on their K slots only).
// The question it answers: does a recipe's step time follow its FLOPs? MoE at the dense
// model's active FLOPs should cost about the dense step; MoD and MoDE spend fewer FLOPs and
// should be faster by as much.
//   ./build/benchmarks/mode_bench                 (tiny_dense, tiny_mod, tiny_moe,
//                                                   tiny_mode_staged, tiny_mode_integrated)
//   ./build/benchmarks/mode_bench --config A --config B --set train.batch_size=16
//
// Checks before it times, per recipe: the parameter count of count_flops equals the built
// model's; the first step's loss is finite and within 10% of ln V (near-uniform predictions of
// small initial weights on random targets); the gradient norm is finite and positive; every
// parameter (routers, predictors, every expert) received a gradient. Every recipe must step
// on the same number of tokens, so that ms/step compare directly.
//
// Timing: one step is zero_grad, forward with targets (training-time routing), backward,
// clip_grad_norm, AdamW, on a fixed random batch (expert choice has data-independent shapes,
// so the tokens do not change the work). The recipes are stepped interleaved, one step of each
// per round, so load from other processes falls on all of them; best and median of the rounds
// are printed, ratios use the medians. Ratios are against the first recipe (tiny_dense). MFU is
// against the best 1024^3 SGEMM, timed once per round as well (load lowers it as it does steps).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/bench_common.h"
#include "benchmarks/bench_trainee.h"
#include "configs/config.h"
#include "core/cpu/blas.h"
#include "core/device_report.h"
#include "core/random.h"
#include "launcher/cli.h"
#include "model/flops.h"
#include "model/moe_routing.h"
#include "model/routing_schedule.h"
#include "model/transformer.h"
#include "train/trainer.h"

using namespace mod;
using bench::Timing;
using bench::Trainee;
namespace po = cli::po;
using bench::Clock;
using bench::load_average;
using bench::resolve;
using bench::seconds_since;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "mode_bench: %s\n", what.c_str());
  std::exit(1);
}

// Seconds of one 1024^3 SGEMM (the ceiling MFU is measured against), timed in every round
// with the recipes so that it sees the same load from other processes.
double sgemm_seconds() {
  constexpr int64_t n = 1024;
  static std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const auto t0 = Clock::now();
  cpu::blas_gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  return seconds_since(t0);
}

// What the recipe routes, in a few words: "MoD 3/6 blocks at C 32; MoE 6/6 blocks, E 4 (+no-op),
// expert choice, K 64".
std::string describe(const modtrain::ModelConfig& m) {
  std::string out;
  char buf[160];
  const auto routed = model::routed_blocks(m), moe = model::moe_blocks(m);
  const auto capacities = model::block_capacities(m);
  const int n_routed = static_cast<int>(std::count(routed.begin(), routed.end(), true));
  const int n_moe = static_cast<int>(std::count(moe.begin(), moe.end(), true));
  if (n_routed > 0) {
    int64_t c = 0;
    for (int b = 0; b < m.n_layers(); ++b)
      if (routed[b]) c = capacities[b];
    std::snprintf(buf, sizeof buf, "MoD %d/%d blocks at C %lld", n_routed, m.n_layers(),
                  static_cast<long long>(c));
    out += buf;
  }
  if (n_moe > 0) {
    std::vector<int64_t> seen;  // distinct K over the MoE blocks, in block order
    std::string ks;
    for (int b = 0; b < m.n_layers(); ++b) {
      const int64_t k = moe[b] ? model::expert_slots(m.moe(), capacities[b]) : -1;
      if (k < 0 || std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
      seen.push_back(k);
      if (!ks.empty()) ks += '/';
      ks += std::to_string(k);
    }
    std::snprintf(
        buf, sizeof buf, "%sMoE %d/%d blocks, E %d%s, %s, K %s", out.empty() ? "" : "; ", n_moe,
        m.n_layers(), m.moe().n_experts(), m.moe().noop_expert() ? " + no-op" : "",
        m.moe().routing() == modtrain::MoEConfig::TOKEN_CHOICE ? "token choice" : "expert choice",
        ks.c_str());
    out += buf;
  }
  return out.empty() ? "dense" : out;
}

// Before timing: the parameter count of count_flops is the built model's, and the first step
// is right (Trainee::first_step).
void check(Trainee& m) {
  int64_t count = 0;
  for (const auto& [name, p] : m.model->named_parameters()) count += p.numel();
  const Trainee::FirstStep f = m.first_step();
  const bool ok = count == m.flops.parameters && f.ok;
  std::printf(
      "  check %-20s parameters %lld (count_flops %lld); first step loss %.4f (ln V = "
      "%.4f), grad norm %.3g, %lld without gradient  %s\n",
      m.label.c_str(), static_cast<long long>(count), static_cast<long long>(m.flops.parameters),
      f.loss, f.ln_v, m.last_grad_norm, static_cast<long long>(f.missing), ok ? "ok" : "WRONG");
  if (!ok)
    fail(m.label + ": the parameter count or the first training step is wrong; not timing it");
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description o("mode_bench options");
  o.add_options()(
      "config",
      po::value<std::vector<std::string>>()->composing()->default_value(
          {"configs/recipes/tiny_dense.textproto", "configs/recipes/tiny_mod.textproto",
           "configs/recipes/tiny_moe.textproto", "configs/recipes/tiny_mode_staged.textproto",
           "configs/recipes/tiny_mode_integrated.textproto"},
          "tiny_dense tiny_mod tiny_moe tiny_mode_staged tiny_mode_integrated"),
      "RunConfig recipe (repeatable); ratios are against the first");
  cli::add_set_option(o, "override for every recipe: path.to.field=value (repeatable)");
  o.add_options()("steps", po::value<int>()->default_value(10),
                  "timed rounds (one step of every recipe each)")(
      "warmup", po::value<int>()->default_value(2), "untimed rounds first");
  po::variables_map vm;
  try {
    if (!cli::parse(argc, argv, "usage: mode_bench [--config FILE ...] [--set f=v ...] [--steps N]",
                    o, vm))
      return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "mode_bench: %s\n", e.what());
    return 2;
  }
  const int steps = vm["steps"].as<int>(), warmup = vm["warmup"].as<int>();
  if (steps < 1 || warmup < 0) fail("--steps must be >= 1 and --warmup >= 0");

  std::vector<modtrain::RunConfig> cfgs;
  try {
    for (const std::string& path : vm["config"].as<std::vector<std::string>>())
      cfgs.push_back(config::load(resolve(path), cli::overrides(vm)));
  } catch (const std::exception& e) {
    fail(e.what());
  }

  const double start_load = load_average();
  std::printf("%s\n", device_report().c_str());
  const double peak = train::measured_peak_flops();
  std::printf(
      "OpenMP threads %d; SGEMM 1024^3 at start-up %.1f GFLOP/s; load average "
      "(1 min) %.2f%s\n",
      omp_get_max_threads(), peak / 1e9, start_load,
      start_load > 1.5 ? ": the machine is busy, timings will be noisy" : "");

  Rng rng(cfgs.front().train().seed());
  std::vector<std::unique_ptr<Trainee>> ms;
  for (const auto& c : cfgs) {
    if (c.train().grad_accum() > 1)
      std::printf("note: %s: train.grad_accum %d ignored; one micro-batch per step\n",
                  c.name().c_str(), c.train().grad_accum());
    ms.push_back(std::make_unique<Trainee>(c.name(), c, rng));
    const auto& m = c.model();
    std::printf("  %-20s d_model %d, %d layers, d_ff %d, seq %d, batch %d: %s\n", c.name().c_str(),
                m.d_model(), m.n_layers(), m.d_ff(), m.seq_len(), c.train().batch_size(),
                describe(m).c_str());
  }
  for (const auto& m : ms)
    if (m->tokens_per_step() != ms.front()->tokens_per_step())
      fail(m->label + " steps on " + std::to_string(m->tokens_per_step()) + " tokens, " +
           ms.front()->label + " on " + std::to_string(ms.front()->tokens_per_step()) +
           ": set the same train.batch_size and model.seq_len (--set)");

  std::printf(
      "\n== training step: zero_grad, forward, backward, clip, AdamW (random tokens, %lld "
      "per step) ==\n",
      static_cast<long long>(ms.front()->tokens_per_step()));
  for (auto& m : ms) check(*m);
  for (int i = 0; i < warmup; ++i)
    for (auto& m : ms) m->step();
  Timing sgemm;
  for (int i = 0; i < steps; ++i) {
    sgemm.s.push_back(sgemm_seconds());
    for (auto& m : ms) {
      const auto t0 = Clock::now();
      m->step();
      m->timing.s.push_back(seconds_since(t0));
    }
  }
  const double ceiling = std::max(peak, 2.0 * 1024 * 1024 * 1024 / sgemm.best());
  std::printf(
      "  SGEMM 1024^3 in the rounds: best %.1f GFLOP/s, median %.1f; MFU below is against "
      "%.1f GFLOP/s, the best of these and the start-up measurement\n",
      2.0 * 1024 * 1024 * 1024 / sgemm.best() / 1e9,
      2.0 * 1024 * 1024 * 1024 / sgemm.median() / 1e9, ceiling / 1e9);

  const Trainee& base = *ms.front();
  const double tok = static_cast<double>(base.tokens_per_step());
  std::printf("\n%-20s %7s %11s %6s %9s %9s %8s %8s %6s %7s %7s %9s\n", "recipe", "params",
              "train FLOP", "FLOP", "ms/step", "ms/step", "tok/s", "GFLOP/s", "MFU", "time",
              "speed-", "speed-up /");
  std::printf("%-20s %7s %11s %6s %9s %9s %8s %8s %6s %7s %7s %9s\n", "", "(M)", "/token", "ratio",
              "(median)", "(best)", "", "", "", "ratio", "up", "FLOP cut");
  for (const auto& m : ms) {
    const double t = m->timing.median(), flops_step = m->flops.training_per_token * tok;
    const double flop_ratio = m->flops.training_per_token / base.flops.training_per_token;
    const double time_ratio = t / base.timing.median();
    std::printf("%-20s %7.2f %11.4g %6.3f %9.1f %9.1f %8.0f %8.1f %5.1f%% %7.3f %6.2fx %8.1f%%\n",
                m->label.c_str(), m->flops.parameters / 1e6, m->flops.training_per_token,
                flop_ratio, 1e3 * t, 1e3 * m->timing.best(), tok / t, flops_step / t / 1e9,
                100 * flops_step / t / ceiling, time_ratio, 1 / time_ratio,
                100 * (1 / time_ratio) / (1 / flop_ratio));
  }
  std::printf(
      "(FLOP ratio, time ratio: the recipe's over %s's; speed-up = 1 / time ratio; speed-up / "
      "FLOP cut = speed-up over 1 / FLOP ratio: 100%% means the step time follows the active "
      "FLOPs, less means the routing's own work (selection on the host, gathers, scatters, "
      "small GEMMs) costs more than its FLOPs show)\n",
      base.label.c_str());
  std::printf("load average (1 min): %.2f at the start, %.2f at the end\n", start_load,
              load_average());
  return 0;
}
