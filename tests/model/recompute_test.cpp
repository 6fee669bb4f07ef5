// Activation recomputation (train.recompute): FULL and SELECTIVE give the losses, gradients,
// routing and MoE statistics of NONE bit for bit, over two accumulated micro-batches, for dense,
// MoD (predictor and aux-BCE), staged and integrated MoDE and a token-choice MoE.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/backend.h"
#include "core/autograd.h"
#include "model/transformer.h"
#include "tests/support/step_outcome.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::model;
using modtrain::TrainConfig;

namespace {

test::StepOutcome train_step(const modtrain::ModelConfig& cfg, Recompute mode, DType dtype,
                             const std::vector<int>& blocks = {}) {
  Transformer model(cfg, 42, dtype);
  model.set_recompute(mode, blocks);
  return test::two_micro_batch_step(model, cfg);
}

std::map<std::string, modtrain::ModelConfig> configs() {
  std::map<std::string, modtrain::ModelConfig> c;
  c["dense"] = test::tiny_model(false);
  c["mod predictor"] = test::tiny_model(true);
  c["mod predictor"].mutable_mod()->mutable_causal()->set_method(
      modtrain::CausalRoutingConfig::PREDICTOR);
  c["mod aux bce, sigmoid gate"] = test::tiny_model(true);
  c["mod aux bce, sigmoid gate"].mutable_mod()->mutable_causal()->set_method(
      modtrain::CausalRoutingConfig::AUX_BCE);
  c["mod aux bce, sigmoid gate"].mutable_mod()->mutable_router()->set_gate(
      modtrain::RouterConfig::SIGMOID);
  c["staged mode"] = test::tiny_moe(true);
  c["integrated mode"] = test::tiny_moe(false, true);
  c["token-choice moe"] = test::tiny_moe(false);
  c["token-choice moe"].mutable_moe()->set_routing(modtrain::MoEConfig::TOKEN_CHOICE);
  c["token-choice moe"].mutable_moe()->set_top_k(2);
  c["token-choice moe"].mutable_moe()->set_capacity_factor(1.25);
  c["token-choice moe"].mutable_moe()->set_balance_weight(0.01);
  for (auto& [name, m] : c)
    if (m.moe().enabled()) m.mutable_moe()->set_z_weight(0.001);  // an aux loss in every MoE
  return c;
}

}  // namespace

TEST_CASE("FULL and SELECTIVE recomputation match NONE bitwise", "[model][recompute]") {
  for (const auto& [name, cfg] : configs()) {
    for (DType dtype : {DType::F32, DType::F64}) {
      const test::StepOutcome none = train_step(cfg, TrainConfig::NONE, dtype);
      for (Recompute mode : {TrainConfig::FULL, TrainConfig::SELECTIVE}) {
        INFO(name << ", " << dtype_name(dtype) << ", " << TrainConfig::Recompute_Name(mode));
        test::check_same(train_step(cfg, mode, dtype), none);
      }
    }
  }
}

TEST_CASE("recompute_blocks limits recomputation to the listed blocks", "[model][recompute]") {
  const modtrain::ModelConfig cfg = test::tiny_moe(true);
  const test::StepOutcome none = train_step(cfg, TrainConfig::NONE, DType::F32);
  for (const std::vector<int>& blocks : {std::vector<int>{0}, std::vector<int>{1}}) {
    INFO("block " << blocks[0]);
    test::check_same(train_step(cfg, TrainConfig::FULL, DType::F32, blocks), none);
  }
  Transformer model(cfg, 1);
  model.set_recompute(TrainConfig::SELECTIVE, {1});
  CHECK(model.recompute(0) == TrainConfig::NONE);
  CHECK(model.recompute(1) == TrainConfig::SELECTIVE);
  CHECK_THROWS_WITH(model.set_recompute(TrainConfig::FULL, {2}),
                    Catch::Matchers::Contains("train.recompute_blocks") &&
                        Catch::Matchers::Contains("2 is not a block in [0, 2)"));
}

namespace {
// Bytes the CPU allocator holds above what it held before forward, at the highest point of a
// forward and backward whose parameter gradients already exist (a second step accumulates
// into them), so what is counted is activations and backward's temporaries.
double peak_activation_bytes(const modtrain::ModelConfig& cfg, Recompute mode) {
  Transformer model(cfg, 7);
  model.set_recompute(mode);
  const Tensor tokens = test::tokens_for(1, cfg.seq_len(), cfg.vocab_size(), 3);
  const Tensor targets = test::tokens_for(1, cfg.seq_len(), cfg.vocab_size(), 4);
  backward(model.forward(tokens, targets).loss);  // allocates every parameter's gradient
  Backend& cpu = backend(Device::CPU);
  const double before = static_cast<double>(cpu.memory_stats().in_use_bytes);
  cpu.reset_peak_memory();
  backward(model.forward(tokens, targets).loss);
  return static_cast<double>(cpu.memory_stats().peak_in_use_bytes) - before;
}
}  // namespace

TEST_CASE("FULL recomputation at the GPT-2-small shape keeps at most 35% of NONE's activations",
          "[model][recompute]") {
  const char* src = std::getenv("MOD_SOURCE_DIR");
  const modtrain::RunConfig run = config::load(
      std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/gpt2_small_dense.textproto", {});
  const modtrain::ModelConfig& cfg = run.model();
  REQUIRE(cfg.d_model() == 768);
  REQUIRE(cfg.n_layers() == 12);
  REQUIRE(cfg.seq_len() == 1024);
  const double none = peak_activation_bytes(cfg, TrainConfig::NONE);
  const double full = peak_activation_bytes(cfg, TrainConfig::FULL);
  std::printf("GPT-2-small shape, batch 1: peak activation memory NONE %.1f MB, FULL %.1f MB (%.0f%%)\n",
              none / 1e6, full / 1e6, 100 * full / none);
  CHECK(full <= 0.35 * none);
}
