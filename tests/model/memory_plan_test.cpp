// The memory planner (model/memory_plan.h) against the allocator: the predicted peak of one
// training step (forward, backward, clipping, AdamW) within 10% of the CPU allocator's measured
// peak of bytes in use, for the tiny recipes and a GPT-2-small shape; parameter counts equal
// the built model's; a tp2/dp2/zero1 layout divides what tensor and data parallelism split.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "configs/config.h"
#include "core/backend.h"
#include "model/memory_plan.h"
#include "model/transformer.h"
#include "tests/support/tiny_configs.h"
#include "tests/support/tiny_runs.h"
#include "train/data/token_file.h"
#include "train/trainer.h"

using namespace mod;

namespace {

// Token shards with `vocab` symbols (random: the step's memory does not depend on them).
std::string corpus_with_vocab(uint32_t vocab) {
  const std::string dir = test::temp_dir("memcorpus");
  Rng rng(3);
  auto tokens = [&](size_t n) {
    std::vector<uint32_t> t(n);
    for (auto& x : t) x = static_cast<uint32_t>(rng.below(vocab));
    return t;
  };
  data::write_shard(dir + "/train.bin", tokens(40000), vocab);
  data::write_shard(dir + "/val.bin", tokens(8000), vocab);
  return dir;
}

modtrain::RunConfig recipe(const std::string& name, std::vector<std::string> sets) {
  const char* src = std::getenv("MOD_SOURCE_DIR");
  sets.insert(sets.begin(), {"train.steps=1", "train.eval_every=0"});
  return config::load(std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/" + name +
                          ".textproto",
                      sets);
}

// Bytes in use at the highest point of one training step, counting the trainer's own
// parameters and optimizer state (whatever else the process holds is left out).
double measured_peak(const modtrain::RunConfig& cfg) {
  const double before = static_cast<double>(backend(Device::CPU).memory_stats().in_use_bytes);
  train::Trainer trainer(cfg, test::temp_dir("memrun"), /*quiet=*/true);
  trainer.run();
  return static_cast<double>(trainer.peak_memory_bytes()) - before;
}

struct PeakCase {
  const char* recipe;
  std::vector<std::string> sets;  // the run's overrides (train.recompute among them)
};

void check_peak(const PeakCase& c, const std::string& data_dir) {
  std::vector<std::string> sets = c.sets;
  sets.push_back("data.dir=" + data_dir);
  const modtrain::RunConfig cfg = recipe(c.recipe, sets);
  const model::MemoryPlan plan = model::plan_memory(cfg);
  const double measured = measured_peak(cfg);
  std::printf("%s: predicted %s, measured %s (%+.1f%%), peak at %s\n", c.recipe,
              model::format_bytes(plan.peak).c_str(), model::format_bytes(measured).c_str(),
              100 * (plan.peak - measured) / measured, plan.peak_at.c_str());
  INFO(c.recipe << ": predicted " << plan.peak << " bytes, measured " << measured);
  CHECK(plan.peak == Approx(measured).epsilon(0.10));
}

}  // namespace

TEST_CASE("predicted peak memory matches the CPU allocator's measured peak within 10%",
          "[memory]") {
  const std::string data = test::markov_corpus();
  const std::vector<PeakCase> cases = {
      {"tiny_dense", {}},
      {"tiny_mod", {}},
      {"tiny_moe", {}},
      {"tiny_mode_integrated", {}},
      {"tiny_mode_staged", {}},
      {"tiny_dense", {"train.recompute=FULL"}},
      {"tiny_mod", {"train.recompute=FULL"}},
      {"tiny_dense", {"train.recompute=SELECTIVE"}},
      {"tiny_mod", {"train.recompute=SELECTIVE"}},
      {"tiny_mode_staged", {"train.recompute=FULL", "train.recompute_blocks=[1, 3]"}},
  };
  for (const PeakCase& c : cases) check_peak(c, data);
}

TEST_CASE("predicted peak memory of a GPT-2-small shape matches the measured peak within 10%",
          "[memory][slow]") {
  const std::string data = corpus_with_vocab(50257);
  for (const char* mode : {"NONE", "FULL"})
    check_peak({"gpt2_small_dense",
                {"model.vocab_size=50257", "train.batch_size=1", "train.grad_accum=1",
                 std::string("train.recompute=") + mode}},
               data);
}

TEST_CASE("planned parameters equal the built model's, whatever its blocks", "[memory]") {
  for (bool mod : {false, true}) {
    modtrain::ModelConfig variants[] = {test::tiny_model(mod), test::tiny_moe(mod),
                                        test::tiny_moe(mod, /*noop_expert=*/true),
                                        test::tiny_model(mod)};
    variants[0].set_tie_embeddings(false);
    variants[3].set_norm(modtrain::ModelConfig::LAYER);  // a bias in every norm
    variants[0].mutable_mod()->mutable_causal()->set_method(
        modtrain::CausalRoutingConfig::PREDICTOR);
    variants[0].mutable_mod()->mutable_router()->set_bias(true);
    for (const auto& cfg : variants) {
      const model::Transformer built(cfg, 1);
      const model::MemoryPlan plan = model::plan_memory(cfg, model::MemoryOptions{});
      CHECK(plan.parameters == Approx(4.0 * built.num_parameters()));
    }
  }
}

TEST_CASE("tp 2 x dp 2 with ZeRO-1 divides what tensor and data parallelism split", "[memory]") {
  modtrain::ModelConfig cfg = test::tiny_model(true);
  cfg.set_vocab_size(64);
  cfg.set_d_model(32);
  cfg.set_n_heads(4);
  cfg.set_d_ff(128);
  model::MemoryOptions one;
  one.batch_per_rank = 4;
  model::MemoryOptions split = one;
  split.layout = {2, 2, 1, 1};
  split.batch_per_rank = 2;  // the same global batch of 4 over dp 2
  const model::MemoryPlan a = model::plan_memory(cfg, one), b = model::plan_memory(cfg, split);

  // Replicated over tp: the norms, routers and predictors; everything else halves.
  const double d = cfg.d_model(), h = cfg.mod().causal().predictor_hidden();
  const bool predictor =
      cfg.mod().causal().method() == modtrain::CausalRoutingConfig::PREDICTOR;
  const double router = d + (cfg.mod().router().bias() ? 1 : 0);
  const double replicated = 4.0 * (d * (2 * cfg.n_layers() + 1) + router +
                                   (predictor ? d * h + 2 * h + 1 : 0));  // one routed block
  CHECK(b.parameters == Approx((a.parameters - replicated) / 2 + replicated));
  CHECK(b.gradients == Approx(b.parameters));
  CHECK(b.optimizer == Approx(2 * b.parameters / 2));  // m and v, sharded over dp 2
  CHECK(a.optimizer == Approx(2 * a.parameters));
  // Half the sequences per rank, and heads and MLP units split: every block keeps less.
  for (size_t i = 0; i < a.blocks.size(); ++i) CHECK(b.blocks[i].kept < a.blocks[i].kept / 2);
  CHECK(b.head_kept < a.head_kept / 2);
  CHECK(b.peak < a.peak);
}

TEST_CASE("FULL recomputation keeps only the recomputed blocks' inputs", "[memory]") {
  const modtrain::ModelConfig cfg = test::tiny_model(true);
  model::MemoryOptions none, full, some;
  none.batch_per_rank = full.batch_per_rank = some.batch_per_rank = 4;
  full.recompute = some.recompute = modtrain::TrainConfig::FULL;
  some.recompute_blocks = {0};
  const model::MemoryPlan a = model::plan_memory(cfg, none), b = model::plan_memory(cfg, full),
                          c = model::plan_memory(cfg, some);
  const double x = 4.0 * 4 * cfg.seq_len() * cfg.d_model();  // block 0's input [B,T,D] f32
  CHECK(b.blocks[0].kept == Approx(x));
  CHECK(b.blocks[1].kept < a.blocks[1].kept);
  CHECK(b.blocks[0].backward_temp > a.blocks[0].backward_temp);  // the recomputed forward
  CHECK(c.blocks[0].recomputed);
  CHECK_FALSE(c.blocks[1].recomputed);
  CHECK(c.blocks[1].kept == Approx(a.blocks[1].kept));
}

TEST_CASE("SELECTIVE recomputation keeps less than NONE and more than FULL", "[memory]") {
  const modtrain::ModelConfig cfg = test::tiny_model(true);
  model::MemoryOptions none;
  none.batch_per_rank = 4;
  model::MemoryOptions selective = none, full = none;
  selective.recompute = modtrain::TrainConfig::SELECTIVE;
  full.recompute = modtrain::TrainConfig::FULL;
  const model::MemoryPlan a = model::plan_memory(cfg, none), s = model::plan_memory(cfg, selective),
                          f = model::plan_memory(cfg, full);
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    CHECK(s.blocks[i].kept < a.blocks[i].kept);
    CHECK(s.blocks[i].kept > f.blocks[i].kept);
    CHECK(s.blocks[i].backward_temp < f.blocks[i].backward_temp);  // less to make again
  }
}

// Under bf16 the unfused router keeps an f32 copy of a routed block's input [B,T,D] (and the
// predictor's logit layer one of its hidden layer [B,T,hidden]); with
// train.fusions.router_scores they keep the bf16 tensors themselves: 2 bytes an element less,
// in routed blocks only.
TEST_CASE("the fused router keeps the bf16 block input, not an f32 copy", "[memory]") {
  const modtrain::ModelConfig cfg = test::tiny_model(true);
  model::MemoryOptions unfused, fused;
  unfused.batch_per_rank = fused.batch_per_rank = 4;
  unfused.bf16 = fused.bf16 = true;
  fused.fused_router_scores = true;
  const model::MemoryPlan a = model::plan_memory(cfg, unfused), b = model::plan_memory(cfg, fused);
  REQUIRE(cfg.mod().causal().method() == modtrain::CausalRoutingConfig::PREDICTOR);
  const double saved =
      2.0 * 4 * cfg.seq_len() * (cfg.d_model() + cfg.mod().causal().predictor_hidden());
  int routed = 0;
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    INFO("block " << i);
    CHECK(a.blocks[i].kept - b.blocks[i].kept == Approx(a.blocks[i].routed ? saved : 0.0));
    routed += a.blocks[i].routed;
  }
  CHECK(routed > 0);
}
