// The parity harness: a recipe under parallel layouts against one process on the same global
// batch (docs/architecture.md section 4). Used by parity_test.cpp (tiny_dense, tiny_mod) and
// mode_parity_test.cpp (MoDE under expert parallelism).
//
// Each recipe runs 20 steps (MoDE: 10) under each layout the world size allows. World rank 0
// trains the single-process reference on its local communicator and broadcasts it; every rank
// then checks its own run.
//
// np4 adds dp4 under ZeRO-2; np2 checks ZeRO-2 bitwise against ZeRO-1 (parity_test.cpp).
//
// Tolerance: float32 throughout; a layout changes only the order of sums (row-parallel partial
// products, dp averaging), so per-step losses must agree to a relative 1e-5, and each final
// parameter to a relative 1e-5 in norm (||p - p_ref|| / ||p_ref||).
#pragma once

#include "tests/support/tiny_runs.h"

namespace mod::test::parity {
inline constexpr double kTolerance = 1e-5;
inline constexpr int kSteps = 20;
inline constexpr int kExpertSteps = 10;  // MoDE layouts: 12 runs at np4, so fewer steps each

// MOD_PARITY_DEVICE=CUDA runs every layout and the reference on GPUs (one per rank; a machine
// with as many GPUs as ranks): the layouts on GPUs against one GPU (docs/gpu.md).
inline std::vector<std::string> device_sets() {
  const char* device = std::getenv("MOD_PARITY_DEVICE");
  if (!device || std::string(device).empty()) return {};
  return {std::string("train.device=") + device};
}

// name: a recipe, or "tiny_moe_token_choice" (tiny_moe with top-2 token choice, capacity 1.25);
// extra: more --set assignments.
inline modtrain::RunConfig recipe(const std::string& name, const std::string& layout, int steps,
                                  const std::vector<std::string>& extra = {}) {
  std::vector<std::string> sets = device_sets();
  sets.insert(sets.end(), extra.begin(), extra.end());
  if (name == "tiny_moe_token_choice") {
    for (const char* s : {"model.moe.routing=TOKEN_CHOICE", "model.moe.top_k=2",
                          "model.moe.capacity_factor=1.25"})
      sets.push_back(s);
    return test::tiny_recipe("tiny_moe", steps, layout, sets);
  }
  return test::tiny_recipe(name, steps, layout, sets);
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;  // full (gathered) parameters
};

// Every run checks, every step, that all tp ranks chose the same tokens.
inline RunResult train(const modtrain::RunConfig& cfg, parallel::Communicator& world) {
  train::TestHooks check_routing;
  check_routing.check_tp_routing = true;
  train::Trainer trainer(cfg, temp_dir("parity_run"), /*quiet=*/true, world, check_routing);
  trainer.run();
  RunResult r{trainer.losses(), trainer.full_parameters()};
  for (auto& [name, p] : r.params) p = p.to(Device::CPU);  // compared and broadcast on the host
  return r;
}

// World rank 0 trains alone; the result reaches every rank.
inline RunResult reference(const std::string& name, int steps,
                           const std::vector<std::string>& extra = {}) {
  auto& world = parallel::world();
  RunResult ref;
  if (world.rank() == 0) {
    auto local = parallel::make_local_communicator();
    ref = train(recipe(name, "", steps, extra), *local);
  }
  Tensor losses = Tensor::zeros({steps}, DType::F64);
  if (world.rank() == 0) losses = Tensor::from_vector(ref.losses, {steps}, DType::F64);
  world.broadcast(losses, 0);
  ref.losses = losses.to_vector();
  if (world.rank() != 0) {
    // Same names and shapes as rank 0's model: build one to learn them.
    modtrain::ModelConfig m = recipe(name, "", steps, extra).model();
    model::Transformer shape_of(m, 0);
    for (const auto& [n, p] : shape_of.named_parameters()) ref.params.emplace_back(n, Tensor::empty(p.shape()));
  }
  for (auto& [n, p] : ref.params) world.broadcast(p, 0);
  return ref;
}

inline std::vector<std::string> layouts(int world) {
  if (world == 2) return {"dp=1 tp=2", "dp=2 tp=1", "dp=2 tp=1 zero1=true"};
  if (world == 4)
    return {"dp=2 tp=2", "dp=2 tp=2 zero1=true", "dp=4 tp=1", "dp=4 tp=1 zero_stage=2"};
  return {"dp=1 tp=1 zero1=true"};  // a world of one: the parallel code paths still run
}

// Expert parallelism: ep=2 alone, with ZeRO-2 (np2) and ZeRO-1 (np4), with tp (tokens
// de-duplicated over tp), and with more data parallelism than ep (expert gradients reduced over
// their edp group). Four
// oversubscribed ranks on two cores are slow, so np4 runs the two layouts that compose most.
inline std::vector<std::string> expert_layouts(int world) {
  if (world == 2) return {"dp=2 ep=2", "dp=2 ep=2 zero_stage=2", "tp=2"};
  if (world == 4) return {"dp=4 ep=2", "dp=2 tp=2 ep=2 zero1=true"};
  return {"zero1=true"};
}

// A recipe's variant: assignments for the reference and every layout (e.g. grad_accum), and
// assignments for the layouts only, which must not change the result (e.g. train.recompute).
struct Variant {
  std::vector<std::string> everywhere, layouts_only;
};

inline void check_layouts(const std::string& name, bool experts = false,
                          const Variant& variant = {}) {
  auto& world = parallel::world();
  const int steps = experts ? kExpertSteps : kSteps;
  const RunResult ref = reference(name, steps, variant.everywhere);
  std::vector<std::string> layout_sets = variant.everywhere;
  layout_sets.insert(layout_sets.end(), variant.layouts_only.begin(), variant.layouts_only.end());
  INFO(name << " on " << world.size() << " ranks, world rank " << world.rank());
  REQUIRE(ref.losses.back() < ref.losses.front() - 0.3);  // it learns, so the check means something
  for (const std::string& layout : experts ? expert_layouts(world.size()) : layouts(world.size())) {
    INFO("layout " << layout);
    const RunResult got = train(recipe(name, layout, steps, layout_sets), world);
    REQUIRE(got.losses.size() == ref.losses.size());
    for (size_t s = 0; s < got.losses.size(); ++s) {
      INFO("step " << s + 1 << ": " << got.losses[s] << " vs " << ref.losses[s]);
      CHECK(std::abs(got.losses[s] - ref.losses[s]) <= kTolerance * std::abs(ref.losses[s]));
    }
    REQUIRE(got.params.size() == ref.params.size());
    for (size_t i = 0; i < got.params.size(); ++i) {
      INFO("parameter " << got.params[i].first);
      REQUIRE(got.params[i].first == ref.params[i].first);
      REQUIRE(got.params[i].second.shape() == ref.params[i].second.shape());
      CHECK(relative_norm_diff(got.params[i].second, ref.params[i].second) < kTolerance);
    }
  }
}
}  // namespace mod::test::parity

