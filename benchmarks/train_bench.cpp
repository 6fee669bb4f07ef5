// train_bench: the single-process workflow, dense twin against the MoD model of one config.
// Checks before it times (one step's loss at init is finite and near ln V; every parameter gets
// a gradient), then times full training steps (zero_grad, forward with targets, backward,
// clip_grad_norm, AdamW) and sampling, and prints them next to the napkin math: FLOP ratio
// from count_flops, the share of the measured SGEMM rate. Targets: MoD speed-up >= 95% of the
// FLOP ratio; MoD sampling >= 1.6x dense with the predictor admitting ~capacity of the tokens.
//
// Dense and MoD steps are timed interleaved (one of each per round) so that load from other
// processes falls on both; best and median of the rounds are printed.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "benchmarks/bench_common.h"
#include "benchmarks/bench_trainee.h"
#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/device_report.h"
#include "core/random.h"
#include "launcher/cli.h"
#include "model/flops.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "train/trainer.h"

using namespace mod;
using bench::random_tokens;
using bench::Timing;
using bench::Trainee;
namespace po = cli::po;
using bench::Clock;
using bench::seconds_since;

namespace {

void fail(const std::string& what) {
  std::fprintf(stderr, "train_bench: %s\n", what.c_str());
  std::exit(1);
}

// Before timing: the first step is right (Trainee::first_step; routers and predictors
// included in the gradient check).
void check_first_step(Trainee& m) {
  const Trainee::FirstStep f = m.first_step();
  std::printf(
      "  check %-5s first step: loss %.4f (ln V = %.4f), grad norm %.3g, %lld params "
      "without gradient  %s\n",
      m.label.c_str(), f.loss, f.ln_v, m.last_grad_norm, static_cast<long long>(f.missing),
      f.ok ? "ok" : "WRONG");
  if (!f.ok) fail(m.label + ": the first training step is wrong; not timing it");
}

// Copies the weights of block b of `from` into the standalone block `to`.
void copy_block(const model::Transformer& from, int b, model::Block& to) {
  const std::string prefix = "blocks." + std::to_string(b) + ".";
  for (auto& [name, p] : to.named_parameters()) {
    Tensor dst = p;
    dst.copy_from(from.parameter(prefix + name));
  }
}

// Sets each routed block's predictor output bias so that the predictor admits `fraction` of
// the tokens of `tokens` [B,T]: runs the causal-routing forward block by block on standalone
// copies of the blocks, and at each routed block sets the bias to minus the (1 - fraction)
// quantile of the predictor logits on that block's actual inputs. Returns the biases. Checks
// that the copy's logits equal Transformer::forward in causal mode with the new biases.
std::vector<double> calibrate_predictors(model::Transformer& m, double fraction,
                                         const Tensor& tokens, const char* label) {
  const auto& cfg = m.config();
  NoGradGuard no_grad;
  const int64_t b = tokens.size(0), t = tokens.size(1);
  Tensor x = embedding(tokens, m.parameter("embed.weight"));
  std::vector<int64_t> pos_v(b * t);
  for (int64_t i = 0; i < b * t; ++i) pos_v[i] = i % t;
  const Tensor pos = Tensor::from_indices(pos_v, {b, t});
  std::vector<double> biases;
  for (int blk_i = 0; blk_i < cfg.n_layers(); ++blk_i) {
    Rng unused(0);
    model::Block blk(cfg, m.routed(blk_i), unused);
    copy_block(m, blk_i, blk);
    if (!m.routed(blk_i)) {
      x = add(x, blk.delta(x, pos));
      continue;
    }
    if (!blk.predictor()) fail("calibration needs causal.method PREDICTOR");
    const std::string bias_name = "blocks." + std::to_string(blk_i) + ".predictor.out.bias";
    Tensor bias = m.parameter(bias_name);
    bias.set(0, 0.0);
    blk.parameter("predictor.out.bias").set(0, 0.0);
    const std::vector<double> logits = blk.predictor()->logits(x).to_vector();
    // Midway between the last rejected and the first admitted logit, so that no token sits
    // on the threshold where rounding could flip it.
    std::vector<double> sorted = logits;
    std::sort(sorted.begin(), sorted.end());
    const size_t q = std::clamp<size_t>(std::llround((1.0 - fraction) * sorted.size()), 1,
                                        sorted.size() - 1);
    const double threshold = 0.5 * (sorted[q - 1] + sorted[q]);
    bias.set(0, -threshold);
    biases.push_back(-threshold);
    // This block in causal mode (transformer.cpp causal_block), sequence by sequence.
    Tensor r = blk.router()->scores(x);
    Tensor next = Tensor::empty(x.shape(), x.dtype());
    for (int64_t s = 0; s < b; ++s) {
      std::vector<int64_t> chosen;
      for (int64_t i = 0; i < t; ++i)
        if (logits[s * t + i] - threshold > 0) chosen.push_back(i);
      Tensor xs = x.narrow0(s, 1).clone();
      if (!chosen.empty()) {
        const Tensor idx = Tensor::from_indices(chosen, {1, static_cast<int64_t>(chosen.size())});
        xs = model::routed_update(blk, xs, pos.narrow0(s, 1), r.narrow0(s, 1), idx,
                                  cfg.mod().router().gate(), model::RoutingMode::Causal);
      }
      next.narrow0(s, 1).copy_from(xs);
    }
    x = next;
  }
  if (cfg.tie_embeddings()) {
    const Tensor h = std::dynamic_pointer_cast<nn::Norm>(m.find_module("final_norm"))->forward(x);
    const auto ours = matmul(h, m.parameter("embed.weight"), false, true).to_vector();
    const auto model = m.forward(tokens, Tensor(), model::RoutingMode::Causal).logits.to_vector();
    double err = 0;
    for (size_t i = 0; i < ours.size(); ++i) err = std::max(err, std::abs(ours[i] - model[i]));
    std::printf("  check calibration on %-13s replica vs forward(Causal) logits: max|diff| %.2e  %s\n",
                label, err, err < 1e-3 ? "ok" : "WRONG");
    if (err >= 1e-3) fail("the calibration's causal forward disagrees with the model's");
  }
  return biases;
}

struct SampleResult {
  double tokens_per_s = 0;
  std::vector<double> admitted_fraction;  // per routed block
};

// One generation: a one-token prompt and the sampling seed (temperature 1: the text varies as
// in real use).
struct Prompt {
  int64_t first;
  uint64_t seed;
};

std::vector<int64_t> generate_text(const model::Transformer& m, const Prompt& p, int64_t n) {
  model::SamplingParams params;
  params.seed = p.seed;
  const auto g = model::generate(m, {p.first}, n, params);
  std::vector<int64_t> text{p.first};
  text.insert(text.end(), g.tokens.begin(), g.tokens.end());
  return text;
}

// Generations of n tokens from each prompt, the models interleaved (one generation of each per
// prompt; the first prompt warms up, untimed); tokens/s per model over all the rest together
// (the best single generation would favour the one whose text admitted the fewest tokens).
std::vector<SampleResult> time_sampling(const std::vector<const model::Transformer*>& models,
                                        int64_t n, const std::vector<Prompt>& prompts) {
  std::vector<SampleResult> out(models.size());
  std::vector<std::vector<int64_t>> admitted(models.size()), seen(models.size());
  std::vector<double> tokens(models.size()), seconds(models.size());
  for (size_t rep = 0; rep < prompts.size(); ++rep) {
    model::SamplingParams params;
    params.seed = prompts[rep].seed;
    for (size_t i = 0; i < models.size(); ++i) {
      const auto g = model::generate(*models[i], {prompts[rep].first}, n, params);
      if (rep == 0) continue;
      tokens[i] += static_cast<double>(g.tokens.size());
      seconds[i] += g.seconds;
      admitted[i].resize(g.admitted.size());
      seen[i].resize(g.seen.size());
      for (size_t k = 0; k < g.admitted.size(); ++k) {
        admitted[i][k] += g.admitted[k];
        seen[i][k] += g.seen[k];
      }
    }
  }
  for (size_t i = 0; i < models.size(); ++i) {
    out[i].tokens_per_s = tokens[i] / seconds[i];
    for (size_t k = 0; k < admitted[i].size(); ++k)
      out[i].admitted_fraction.push_back(static_cast<double>(admitted[i][k]) / seen[i][k]);
  }
  return out;
}

// --serve: one timed step per request line, so that another program can interleave its steps
// with ours and both see the same machine load. Answers "READY" once, then seconds per step;
// an "sgemm" request answers with the 1024^3 SGEMM rate measured then, in GFLOP/s, so that
// the other program can take each round's shares against that round's ceiling.
// A FLOPS line first gives training FLOP per token and the SGEMM ceiling at start-up.
int serve_steps(Trainee& dense, Trainee& routed, double ceiling_flops) {
  std::printf("FLOPS per_token dense %.6g mod %.6g sgemm_gflops %.1f\n",
              dense.flops.training_per_token, routed.flops.training_per_token,
              ceiling_flops / 1e9);
  std::printf("READY tokens_per_step %lld\n", static_cast<long long>(dense.tokens_per_step()));
  std::fflush(stdout);
  std::string request;
  while (std::getline(std::cin, request)) {
    if (request == "sgemm") {
      std::printf("%.3f\n", train::measured_peak_flops() / 1e9);
      std::fflush(stdout);
      continue;
    }
    Trainee* which = request == "dense" ? &dense : request == "mod" ? &routed : nullptr;
    if (!which) {
      std::fprintf(stderr,
                   "train_bench --serve: unknown request '%s' (expected dense, mod or sgemm)\n",
                   request.c_str());
      return 2;
    }
    const auto t0 = Clock::now();
    which->step();
    std::printf("%.9f\n", seconds_since(t0));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  po::options_description o("train_bench options");
  o.add_options()("config",
                  po::value<std::string>()->default_value("configs/recipes/tiny_mod.textproto"),
                  "MoD RunConfig; the dense twin sets model.mod.enabled=false");
  cli::add_set_option(o);
  o.add_options()("steps", po::value<int>()->default_value(10), "timed training steps per model")(
      "warmup", po::value<int>()->default_value(2), "untimed training steps per model first")(
      "sample-reps", po::value<int>()->default_value(8),
      "timed generations per model (0: no sampling)")(
      "sample-tokens", po::value<int64_t>()->default_value(0),
      "tokens per generation (0: seq_len - 1)")(
      "serve",
      "after the checks and warm-up, step on request: read 'dense' or 'mod' lines on stdin, answer "
      "each with the step's seconds (benchmarks/pytorch/pytorch_reference.py --against interleaves its "
      "steps with ours this way)");
  po::variables_map vm;
  try {
    if (!cli::parse(argc, argv, "usage: train_bench [--config FILE] [--set f=v ...] [--steps N]", o,
                    vm))
      return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "train_bench: %s\n", e.what());
    return 2;
  }

  modtrain::RunConfig mod_cfg;
  try {
    mod_cfg = cli::load_config(vm);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  if (!mod_cfg.model().mod().enabled()) fail("the config has model.mod.enabled false: nothing to compare");
  modtrain::RunConfig dense_cfg = mod_cfg;
  dense_cfg.mutable_model()->mutable_mod()->set_enabled(false);

  const int steps = vm["steps"].as<int>(), warmup = vm["warmup"].as<int>();
  if (steps < 1 || warmup < 0) fail("--steps must be >= 1 and --warmup >= 0");
  const auto& mc = mod_cfg.model();
  std::printf("%s\n", device_report().c_str());
  // The 1024^3 SGEMM rate at start-up, for the header and --serve's FLOPS line; the shares use
  // a ceiling measured in each round.
  const double ceiling = train::measured_peak_flops();
  std::printf("config %s: d_model %d, %d layers, %d heads, d_ff %d, seq %d, vocab %d, batch %d, "
              "capacity %.3f; OpenMP threads %d; SGEMM ceiling %.1f GFLOP/s (1024^3, measured)\n",
              mod_cfg.name().c_str(), mc.d_model(), mc.n_layers(), mc.n_heads(), mc.d_ff(),
              mc.seq_len(), mc.vocab_size(), mod_cfg.train().batch_size(), mc.mod().capacity(),
              omp_get_max_threads(), ceiling / 1e9);
  if (mod_cfg.train().grad_accum() > 1)
    std::printf("note: train.grad_accum %d ignored; one micro-batch per step\n",
                mod_cfg.train().grad_accum());

  Rng rng(mod_cfg.train().seed());
  Trainee dense("dense", dense_cfg, rng), routed("MoD", mod_cfg, rng);

  std::printf("\n== training step: zero_grad, forward, backward, clip, AdamW (random tokens) ==\n");
  check_first_step(dense);
  check_first_step(routed);
  for (int i = 0; i < warmup; ++i) {
    dense.step();
    routed.step();
  }
  if (vm.count("serve")) return serve_steps(dense, routed, ceiling);
  // Each round measures the SGEMM ceiling and then steps both models: a shared VM's speed moves
  // by 10-30% over tens of seconds, so a share is each step's rate over its own round's ceiling
  // (the median of those), not over one measurement taken before the steps.
  Timing td, tm, ceilings;
  std::vector<double> share_dense, share_mod;
  const double tok = static_cast<double>(dense.tokens_per_step());
  for (int i = 0; i < steps; ++i) {
    const double round_ceiling = train::measured_peak_flops();
    ceilings.s.push_back(round_ceiling);
    auto t0 = Clock::now();
    dense.step();
    td.s.push_back(seconds_since(t0));
    t0 = Clock::now();
    routed.step();
    tm.s.push_back(seconds_since(t0));
    share_dense.push_back(dense.flops.training_per_token * tok / td.s.back() / round_ceiling);
    share_mod.push_back(routed.flops.training_per_token * tok / tm.s.back() / round_ceiling);
  }
  std::printf("  SGEMM ceiling measured each round: %.1f-%.1f GFLOP/s, median %.1f; a share "
              "below is the median over rounds of a step's rate over its round's ceiling\n",
              *std::min_element(ceilings.s.begin(), ceilings.s.end()) / 1e9,
              *std::max_element(ceilings.s.begin(), ceilings.s.end()) / 1e9,
              ceilings.median() / 1e9);
  auto line = [&](const Trainee& m, const Timing& t, const std::vector<double>& shares) {
    const double flops_step = m.flops.training_per_token * tok;
    const double tok_s = tok / t.median();
    std::printf("  %-5s step best %7.1f ms, median %7.1f ms | %.3g FLOP/step (%.4g/token) | "
                "%7.0f tok/s | %5.1f GFLOP/s, %4.1f%% of SGEMM\n",
                m.label.c_str(), 1e3 * t.best(), 1e3 * t.median(), flops_step,
                m.flops.training_per_token, tok_s, flops_step / t.median() / 1e9,
                100 * Timing{shares}.median());
  };
  line(dense, td, share_dense);
  line(routed, tm, share_mod);
  const double flop_ratio = dense.flops.training_per_token / routed.flops.training_per_token;
  const double speedup_best = td.best() / tm.best(), speedup_med = td.median() / tm.median();
  const double eff = speedup_med / flop_ratio;
  std::printf("  speed-up dense/MoD: %.2fx (median), %.2fx (best); FLOP ratio %.2fx; speed-up / "
              "FLOP ratio %.1f%% (target >= 95%%: %s)\n",
              speedup_med, speedup_best, flop_ratio, 100 * eff, eff >= 0.95 ? "met" : "BELOW TARGET");
  // One machine-readable line for benchmarks/compare_pytorch.sh.
  std::printf("RESULT train_tokens_per_s dense %.1f mod %.1f\n", tok / td.median(), tok / tm.median());

  const int reps = vm["sample-reps"].as<int>();
  if (reps > 0) {
    int64_t n = vm["sample-tokens"].as<int64_t>();
    if (n <= 0) n = mc.seq_len() - 1;
    std::printf("\n== sampling: generate %lld tokens, batch 1, KV cache, temperature 1 ==\n",
                static_cast<long long>(n));
    const double cap = mc.mod().capacity();
    // The predictors of an untrained model admit any fraction, so their output biases are set
    // to admit `capacity` of the tokens, the operating point a trained predictor learns: first
    // on random sequences, then twice on 32 sequences the calibrated model sampled (whose
    // statistics the timed generations share; the biases move what the model samples).
    calibrate_predictors(*routed.model, cap, random_tokens(16, mc.seq_len(), mc.vocab_size(), rng),
                         "random tokens");
    constexpr int kCalibrationTexts = 32;
    std::vector<double> biases;
    for (int round = 0; round < 2; ++round) {
      std::vector<int64_t> text;
      for (int i = 0; i < kCalibrationTexts; ++i) {
        const Prompt p{rng.below(mc.vocab_size()), static_cast<uint64_t>(1000 * (round + 1) + i)};
        const auto t = generate_text(*routed.model, p, n);
        text.insert(text.end(), t.begin(), t.end());
      }
      biases = calibrate_predictors(*routed.model, cap,
                                    Tensor::from_indices(text, {kCalibrationTexts, n + 1}),
                                    "sampled text");
    }
    std::vector<Prompt> prompts;  // for timing: other seeds than the calibration's
    for (int rep = 0; rep <= reps; ++rep)
      prompts.push_back({rng.below(mc.vocab_size()), static_cast<uint64_t>(1 + rep)});
    std::printf("  predictor output biases set to admit %.1f%% of the tokens of the sampled text:",
                100 * cap);
    for (double b : biases) std::printf(" %.4g", b);
    std::printf("\n");
    const auto res = time_sampling({dense.model.get(), routed.model.get()}, n, prompts);
    const SampleResult &sd = res[0], &sm = res[1];
    std::printf("  admitted fraction while sampling, per routed block:");
    for (double f : sm.admitted_fraction) std::printf(" %.1f%%", 100 * f);
    std::printf("\n");
    // Napkin math: decoding one token reads every weight of the blocks it passes through once
    // (batch 1: memory- and overhead-bound, not FLOP-bound). A routed block is read for the
    // admitted fraction of the tokens; its router and predictor for every token.
    double dense_w = 0, mod_w = 0;  // weights read per token
    {
      const double d = mc.d_model(), ff = mc.d_ff(), h = mc.mod().causal().predictor_hidden();
      const double blk = 4 * d * d + 2 * d * ff;
      size_t k = 0;
      for (int b = 0; b < mc.n_layers(); ++b) {
        dense_w += blk;
        if (!routed.model->routed(b)) {
          mod_w += blk;
        } else {
          const double f = k < sm.admitted_fraction.size() ? sm.admitted_fraction[k++] : cap;
          mod_w += f * blk + d + d * h + 2 * h + 1;
        }
      }
      dense_w += d * mc.vocab_size();
      mod_w += d * mc.vocab_size();
    }
    for (const auto& [label, r, w] : {std::tuple{"dense", &sd, dense_w}, std::tuple{"MoD", &sm, mod_w}})
      std::printf("  %-5s %7.0f tok/s | %.3g weights (%.1f MB f32) read per token, %.2g matmul "
                  "FLOP/token: %5.1f GB/s, %5.2f GFLOP/s\n",
                  label, r->tokens_per_s, w, 4 * w / 1e6, 2 * w, 4 * w * r->tokens_per_s / 1e9,
                  2 * w * r->tokens_per_s / 1e9);
    const double ratio = sm.tokens_per_s / sd.tokens_per_s;
    std::printf("  MoD/dense sampling %.2fx (target >= 1.6x: %s); weights-per-token ratio %.2fx\n",
                ratio, ratio >= 1.6 ? "met" : "BELOW TARGET", dense_w / mod_w);
    // One machine-readable line for benchmarks/compare_sampling.sh.
    std::printf("RESULT sample_tokens_per_s dense %.1f mod %.1f\n", sd.tokens_per_s, sm.tokens_per_s);
  }
  return 0;
}
