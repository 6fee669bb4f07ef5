// Sizing a model from its config alone: the parameter names and shapes a weights file must
// hold match the built model's, the config's parameter bound is never below the real count, and
// FLOP and memory accounting take time linear in the number of layers.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>

#include "configs/model_size.h"
#include "model/flops.h"
#include "model/memory_plan.h"
#include "model/parameter_shapes.h"
#include "model/transformer.h"
#include "tests/support/tiny_configs.h"

using namespace mod;

namespace {
// Dense, MoD with each causal method and router bias, MoE and both MoDEs, SwiGLU, untied head,
// LayerNorm, explicit and every-k schedules: every branch of the layer constructors.
std::vector<modtrain::ModelConfig> variety() {
  std::vector<modtrain::ModelConfig> out = {test::tiny_model(false), test::tiny_model(true),
                                            test::tiny_moe(false), test::tiny_moe(true),
                                            test::tiny_moe(false, true)};
  auto c = test::tiny_model(true);
  c.set_n_layers(5);
  c.set_mlp(modtrain::ModelConfig::SWIGLU);
  c.set_tie_embeddings(false);
  c.mutable_mod()->mutable_router()->set_bias(true);
  c.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::AUX_BCE);
  c.mutable_mod()->set_schedule(modtrain::MoDConfig::EVERY_KTH);
  c.mutable_mod()->set_every_k(2);
  out.push_back(c);
  auto e = test::tiny_moe(true);
  e.set_n_layers(4);
  e.set_mlp(modtrain::ModelConfig::SWIGLU);
  e.mutable_moe()->set_d_expert(24);
  e.mutable_moe()->set_router_bias(true);
  e.mutable_moe()->set_schedule(modtrain::MoDConfig::EXPLICIT);
  e.mutable_moe()->add_moe_blocks(2);
  e.mutable_mod()->set_schedule(modtrain::MoDConfig::EVERY);
  out.push_back(e);
  auto g = test::tiny_model(true);  // GPT-2's shape: LayerNorm has a bias beside its gain
  g.set_norm(modtrain::ModelConfig::LAYER);
  out.push_back(g);
  return out;
}

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("parameter_shapes lists the built model's parameters, in order, with their shapes",
          "[model]") {
  for (const auto& cfg : variety()) {
    INFO(cfg.ShortDebugString());
    const auto built = model::Transformer(cfg, 1).named_parameters();
    const auto listed = model::parameter_shapes(cfg);
    REQUIRE(listed.size() == built.size());
    for (size_t i = 0; i < built.size(); ++i) {
      CHECK(listed[i].first == built[i].first);
      CHECK(listed[i].second == built[i].second.shape());
    }
  }
}

TEST_CASE("the config's parameter bound is never below the built model's count", "[model]") {
  for (const auto& cfg : variety()) {
    INFO(cfg.ShortDebugString());
    const int64_t real = model::count_flops(cfg).parameters;
    CHECK(real == model::Transformer(cfg, 1).num_parameters());
    CHECK(config::parameter_upper_bound(cfg) >= real);
  }
  // Exact when every block is routed and carries an MoE MLP.
  auto every = test::tiny_moe(true);
  every.mutable_mod()->set_schedule(modtrain::MoDConfig::EVERY);
  CHECK(config::parameter_upper_bound(every) == model::count_flops(every).parameters);
}

TEST_CASE("FLOP and memory accounting take time linear in the number of layers", "[model]") {
  // 100,000 MoD blocks with per-block capacities and recomputation listed for every block: a
  // per-block rescan of the schedule or the list (quadratic) takes tens of seconds here.
  auto cfg = test::tiny_model(true);
  cfg.set_n_layers(100000);
  for (int i = 0; i < 50000; ++i) cfg.mutable_mod()->add_block_capacity(i % 2 ? 0.5 : 0.25);
  model::MemoryOptions opt;
  opt.recompute = modtrain::TrainConfig::FULL;
  for (int b = 0; b < cfg.n_layers(); b += 2) opt.recompute_blocks.push_back(b);
  model::FlopCount flops;
  model::MemoryPlan plan;
  const double t = seconds_of([&] {
    flops = model::count_flops(cfg);
    plan = model::plan_memory(cfg, opt);
  });
  CHECK(t < 3.0);
  REQUIRE(flops.blocks.size() == 100000);
  CHECK(flops.blocks[1].capacity == 3);      // the first routed block: 0.25 x 12
  CHECK(flops.blocks[3].capacity == 6);      // the second: 0.5 x 12
  CHECK(flops.blocks[99999].capacity == 6);  // the 50,000th
  CHECK(flops.blocks[99998].capacity == 12);
  REQUIRE(plan.blocks.size() == 100000);
  CHECK(plan.blocks[3].tokens == 6);
  CHECK(plan.blocks[4].recomputed);
  CHECK_FALSE(plan.blocks[5].recomputed);
}
