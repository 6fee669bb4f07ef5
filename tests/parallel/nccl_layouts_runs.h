// Shared by the GPU-path layout tests (nccl_layouts_test.cpp, nccl_pipeline_test.cpp): a tiny
// run at the emulator's scale on train.device CPU or CUDA (eager or graphed), its per-step
// losses and, on world rank 0 (which writes metrics.csv), its per-step gradient norms; and the
// relative comparison of two runs step by step.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/world.h"
#include "tests/support/metrics_csv.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/trainer.h"

namespace mod::nccl_runs {

constexpr int kSteps = 6;

// tests/cuda_training/gpu_training_test.cpp's emulator scale.
const std::vector<std::string> kSmall = {"model.d_model=128", "model.n_heads=2",
                                         "model.d_ff=512",    "model.n_layers=4",
                                         "model.seq_len=64",  "train.batch_size=2"};

struct Run {
  std::vector<double> losses;
  std::string dir;
  std::vector<double> grad_norms = {};  // metrics.csv's, per step: world rank 0 only (else empty)
};

// `extra` comes last, so it may override the defaults (the batch, the checkpoint cadence).
inline Run train_run(const std::string& recipe, const std::string& layout,
                     const std::string& device, bool graphed,
                     const std::vector<std::string>& extra = {},
                     parallel::Communicator& world = parallel::world(),
                     const std::string& resume_from = "", int steps = kSteps) {
  std::vector<std::string> sets = kSmall;
  // The global batch divides among the data-parallel ranks: one sequence each at 4.
  if (world.size() == 4) sets.push_back("train.batch_size=4");
  sets.push_back("train.device=" + device);
  if (device == "CUDA")
    sets.push_back(std::string("train.cuda_graph=") + (graphed ? "true" : "false"));
  sets.push_back("checkpoint.every_steps=" + std::to_string(steps / 2));
  sets.insert(sets.end(), extra.begin(), extra.end());
  const auto cfg = test::tiny_recipe(recipe, steps, layout, sets);
  Run r;
  r.dir = world.size() > 1 ? test::shared_dir("nccl_layouts") : test::temp_dir("nccl_layouts_one");
  train::Trainer trainer(cfg, r.dir, /*quiet=*/true, world);
  if (!resume_from.empty()) trainer.resume(resume_from);
  trainer.run();
  r.losses = trainer.losses();
  if (parallel::world().rank() == 0)
    r.grad_norms = test::metrics_values(r.dir + "/metrics.csv", "grad_norm");
  return r;
}

inline void require_close(const Run& got, const Run& want, double rtol, size_t first_step = 0) {
  REQUIRE(got.losses.size() + first_step == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    const double g = got.losses[s], w = want.losses[first_step + s];
    INFO("step " << first_step + s + 1 << ": " << g << " vs " << w);
    CHECK(std::isfinite(g));
    CHECK(std::abs(g - w) <= rtol * std::abs(w));
  }
}

struct Layout {
  const char* recipe;
  const char* layout;
  int ranks;
  std::vector<std::string> sets = {};  // more field=value overrides
};

}  // namespace mod::nccl_runs
