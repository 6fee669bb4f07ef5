// What the training benchmarks share: a model with its optimizer stepping on a fixed random
// batch exactly as the trainer steps one micro-batch, and best/median step timings.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "configs/config.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/adamw.h"
#include "train/grad_clip.h"
#include "train/trainer.h"

namespace mod::bench {

struct Timing {
  std::vector<double> s;
  double best() const { return *std::min_element(s.begin(), s.end()); }
  double median() const {
    std::vector<double> v = s;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
};

// tokens [B,T] uniform in [0, V).
inline Tensor random_tokens(int64_t b, int64_t t, int64_t v, Rng& rng) {
  std::vector<int64_t> ids(b * t);
  for (auto& id : ids) id = rng.below(v);
  return Tensor::from_indices(ids, {b, t});
}

// One model with its optimizer, stepping on a fixed random batch.
struct Trainee {
  std::string label;
  modtrain::RunConfig cfg;
  model::FlopCount flops;
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<parallel::AdamW> opt;
  Tensor tokens, targets;
  double last_grad_norm = 0;
  MultiTensorTable norm_table;  // the gradient norm's device table, kept as the trainer keeps it
  Timing timing;

  Trainee(std::string name, const modtrain::RunConfig& c, Rng& rng)
      : label(std::move(name)), cfg(c) {
    flops = model::count_flops(cfg.model());
    model = std::make_unique<model::Transformer>(cfg.model(), cfg.train().seed(), DType::F32,
                                                 model::fusions_from(cfg.train()));
    model->set_recompute(cfg.train().recompute(), {cfg.train().recompute_blocks().begin(),
                                                   cfg.train().recompute_blocks().end()});
    opt = std::make_unique<parallel::AdamW>(model->named_parameters(), cfg.optimizer());
    const int64_t b = cfg.train().batch_size(), t = cfg.model().seq_len(),
                  v = cfg.model().vocab_size();
    tokens = random_tokens(b, t, v, rng);
    targets = random_tokens(b, t, v, rng);
  }
  int64_t tokens_per_step() const { return tokens.numel(); }

  // The trainer's step for one micro-batch (aux losses included); returns the LM loss.
  double step() {
    model->zero_grad();
    model::ForwardResult r = model->forward(tokens, targets);
    r.loss.backward();
    // Clipped as the trainer clips: the factor goes to the update, not a pass of its own.
    const std::vector<Tensor> params = model->parameters();
    const train::ClipFactor clip = train::clip_factor_for(
        params, train::grad_sq_sum(params, params.front().device(), norm_table),
        cfg.optimizer().grad_clip());
    last_grad_norm = clip.norm.item();
    opt->set_learning_rate(cfg.optimizer().lr());
    opt->apply(clip.factor);
    return r.lm_loss.item();
  }

  // The first step, checked before anything is timed: the loss is finite and within 10% of
  // ln V (near-uniform predictions of small initial weights on random targets), the gradient
  // norm finite and positive, and every parameter got a gradient (the others listed on stderr).
  struct FirstStep {
    double loss = 0, ln_v = 0;
    int64_t missing = 0;
    bool ok = false;
  };
  FirstStep first_step() {
    FirstStep f;
    f.loss = step();
    f.ln_v = std::log(static_cast<double>(cfg.model().vocab_size()));
    for (const auto& [name, p] : model->named_parameters())
      if (!p.grad().defined()) {
        std::fprintf(stderr, "  no gradient: %s\n", name.c_str());
        ++f.missing;
      }
    f.ok = std::isfinite(f.loss) && std::abs(f.loss - f.ln_v) < 0.1 * f.ln_v &&
           std::isfinite(last_grad_norm) && last_grad_norm > 0 && f.missing == 0;
    return f;
  }
};

}  // namespace mod::bench
