// Config loading: recipes parse and validate; overrides reach nested, enum and repeated
// fields; every error names the field or file and what was expected.
#include <catch2/catch.hpp>

#include <filesystem>

#include "configs/config.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
const std::string kRecipes = MOD_SOURCE_DIR "/configs/recipes/";
}

TEST_CASE("the tiny recipes load and validate", "[config]") {
  auto dense = config::load(kRecipes + "tiny_dense.textproto", {});
  auto routed = config::load(kRecipes + "tiny_mod.textproto", {});
  CHECK(dense.model().d_model() == 256);
  CHECK_FALSE(dense.model().mod().enabled());
  CHECK(routed.model().mod().enabled());
  CHECK(routed.model().mod().capacity() == Approx(0.125));
  CHECK(routed.model().mod().causal().method() == modtrain::CausalRoutingConfig::PREDICTOR);
}

TEST_CASE("every recipe in configs/recipes loads and validates", "[config]") {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kRecipes)) {
    if (entry.path().extension() != ".textproto") continue;
    INFO(entry.path());
    CHECK_NOTHROW(config::load(entry.path().string(), {}));
    ++n;
  }
  CHECK(n >= 4);
}

TEST_CASE("overrides given with --set reach scalars, enums and repeated fields", "[config]") {
  auto cfg = config::load(kRecipes + "tiny_mod.textproto",
                          {"model.mod.capacity=0.25", "model.mod.schedule=EXPLICIT",
                           "model.mod.routed_blocks=[1, 4]", "train.steps=7",
                           "model.tie_embeddings=false", "data.dir=/tmp/x"});
  CHECK(cfg.model().mod().capacity() == Approx(0.25));
  CHECK(cfg.model().mod().schedule() == modtrain::MoDConfig::EXPLICIT);
  CHECK(cfg.model().mod().routed_blocks_size() == 2);
  CHECK(cfg.model().mod().routed_blocks(1) == 4);
  CHECK(cfg.train().steps() == 7);
  CHECK_FALSE(cfg.model().tie_embeddings());
  CHECK(cfg.data().dir() == "/tmp/x");
}

TEST_CASE("config errors name the field and the expectation", "[config][errors]") {
  const std::string r = kRecipes + "tiny_mod.textproto";
  CHECK_THROWS_WITH(config::load(r, {"model.mod.capacity=1.5"}),
                    Contains("model.mod.capacity") && Contains("(0, 1]"));
  CHECK_THROWS_WITH(config::load(r, {"model.n_heads=3"}),
                    Contains("model.n_heads") && Contains("do not divide"));
  CHECK_THROWS_WITH(config::load(r, {"model.d_modl=3"}),
                    Contains("model.d_modl") && Contains("unknown field"));
  CHECK_THROWS_WITH(config::load(r, {"model.mlp=RELU"}),
                    Contains("model.mlp") && Contains("GELU, SWIGLU"));
  CHECK_THROWS_WITH(config::load(r, {"train.steps=ten"}),
                    Contains("train.steps") && Contains("cannot parse"));
  CHECK_THROWS_WITH(config::load(r, {"model.mod.routed_blocks=9"}),
                    Contains("model.mod.routed_blocks[0]"));
  CHECK_THROWS_WITH(config::load(r, {"capacity"}), Contains("path.to.field=value"));
  CHECK_THROWS_WITH(config::load(r, {"train.profile_steps=-1"}),
                    Contains("train.profile_steps") && Contains("must be >= 0"));
  CHECK_THROWS_WITH(config::load(r, {"train.steps=5", "train.profile_steps=4"}),
                    Contains("train.profile_from") && Contains("within train.steps 5"));
  CHECK_NOTHROW(config::load(r, {"train.steps=5", "train.profile_steps=3"}));  // CPU ops
  CHECK_THROWS_WITH(
      config::load(r, {"optimizer.decay_policy=ALL", "optimizer.decay_embeddings=true"}),
      Contains("optimizer.decay_policy") && Contains("optimizer.decay_embeddings"));
  CHECK_THROWS_WITH(
      config::load(r, {"optimizer.decay_policy=MATRICES", "optimizer.decay_norms_and_biases=false"}),
      Contains("optimizer.decay_policy") && Contains("optimizer.decay_norms_and_biases"));
  CHECK_NOTHROW(config::load(r, {"optimizer.decay_embeddings=true"}));  // the older switch alone
  CHECK_THROWS_WITH(config::load(r, {"model.mod.causal.predictor_grad_clip=-1"}),
                    Contains("model.mod.causal.predictor_grad_clip"));
  CHECK_THROWS_WITH(config::parse_text("model { d_model: 64 colour: 3 }", "inline.textproto"),
                    Contains("inline.textproto:1") && Contains("colour"));
  CHECK_THROWS_WITH(config::load_text("/nonexistent/recipe.textproto"),
                    Contains("/nonexistent/recipe.textproto"));
}

TEST_CASE("the MoE and MoDE recipes load with their routing", "[config][moe]") {
  auto moe = config::load(kRecipes + "tiny_moe.textproto", {});
  auto integrated = config::load(kRecipes + "tiny_mode_integrated.textproto", {});
  auto staged = config::load(kRecipes + "tiny_mode_staged.textproto", {});
  CHECK(moe.model().moe().enabled());
  CHECK_FALSE(moe.model().moe().noop_expert());
  CHECK(integrated.model().moe().noop_expert());
  CHECK(integrated.model().moe().noop_capacity() == Approx(0.5));
  CHECK_FALSE(integrated.model().mod().enabled());
  CHECK(staged.model().mod().enabled());
  CHECK(staged.model().moe().enabled());
  CHECK_FALSE(staged.model().moe().noop_expert());
}

TEST_CASE("MoE config errors name the field and the expectation", "[config][errors][moe]") {
  const std::string r = kRecipes + "tiny_moe.textproto";
  CHECK_THROWS_WITH(
      config::load(r, {"model.moe.routing=TOKEN_CHOICE", "model.moe.noop_expert=true"}),
      Contains("model.moe.noop_expert") && Contains("EXPERT_CHOICE"));
  CHECK_THROWS_WITH(config::load(r, {"model.moe.routing=TOKEN_CHOICE", "model.moe.top_k=3"}),
                    Contains("model.moe.top_k") && Contains("1 or 2"));
  CHECK_NOTHROW(config::load(r, {"model.moe.routing=TOKEN_CHOICE", "model.moe.top_k=2"}));
  CHECK_THROWS_WITH(config::load(r, {"model.moe.capacity_factor=0"}),
                    Contains("model.moe.capacity_factor") && Contains("(0, model.moe.n_experts]"));
  CHECK_THROWS_WITH(config::load(r, {"model.moe.noop_expert=true", "model.moe.noop_capacity=1.5"}),
                    Contains("model.moe.noop_capacity") && Contains("[0, 1]"));
  CHECK_THROWS_WITH(config::load(r, {"model.moe.schedule=EXPLICIT", "model.moe.moe_blocks=[1, 6]"}),
                    Contains("model.moe.moe_blocks[1]") && Contains("[0, 6)"));
  CHECK_THROWS_WITH(config::load(r, {"parallel.ep=3"}),
                    Contains("parallel.ep") && Contains("model.moe.n_experts 4"));
  CHECK_THROWS_WITH(config::load(r, {"model.moe.n_experts=0"}), Contains("model.moe.n_experts"));
  // The same errors stay silent while MoE is off.
  CHECK_NOTHROW(config::load(r, {"model.moe.enabled=false", "model.moe.capacity_factor=0"}));
}

TEST_CASE("sequence parallelism's errors name the fields", "[config][errors]") {
  const std::string r = kRecipes + "tiny_mod.textproto";
  CHECK_NOTHROW(config::load(r, {"parallel.tp=2", "parallel.sequence_parallel=true"}));
  CHECK_THROWS_WITH(config::load(r, {"parallel.sequence_parallel=true"}),
                    Contains("parallel.sequence_parallel") && Contains("parallel.tp > 1"));
  CHECK_THROWS_WITH(
      config::load(r, {"parallel.tp=4", "parallel.sequence_parallel=true", "model.seq_len=250"}),
      Contains("parallel.sequence_parallel") && Contains("model.seq_len 250") &&
          Contains("divisible by parallel.tp 4"));
  // MoE and MoDE train under it too, with tp and with ep (parity_test.cpp).
  for (const char* recipe : {"tiny_moe", "tiny_mode_staged", "tiny_mode_integrated"}) {
    INFO(recipe);
    CHECK_NOTHROW(config::load(kRecipes + recipe + ".textproto",
                               {"parallel.tp=2", "parallel.sequence_parallel=true"}));
    CHECK_NOTHROW(config::load(kRecipes + recipe + ".textproto",
                               {"parallel.tp=2", "parallel.dp=2", "parallel.ep=2",
                                "parallel.sequence_parallel=true"}));
  }
  for (const char* stage : {"1", "2", "3"})  // ZeRO at dp 2 (zero3_tp_test.cpp)
    CHECK_NOTHROW(config::load(r, {"parallel.tp=2", "parallel.dp=2", "train.batch_size=4",
                                   std::string("parallel.zero_stage=") + stage,
                                   "parallel.sequence_parallel=true"}));
}

TEST_CASE("train.fusions switches are on by default and --set turns one off", "[config]") {
  const std::string r = kRecipes + "tiny_dense.textproto";
  CHECK(config::load(r, {}).train().fusions().add_norm());
  CHECK_FALSE(config::load(r, {"train.fusions.add_norm=false"}).train().fusions().add_norm());
  CHECK_THROWS_WITH(config::load(r, {"train.fusions.add_norm=maybe"}), Contains("add_norm"));
  CHECK(config::load(r, {}).train().fusions().gelu_mlp());
  CHECK_FALSE(config::load(r, {"train.fusions.gelu_mlp=false"}).train().fusions().gelu_mlp());
  CHECK(config::load(r, {}).train().fusions().router_scores());
  CHECK_FALSE(
      config::load(r, {"train.fusions.router_scores=false"}).train().fusions().router_scores());
  CHECK(config::load(r, {}).train().fusions().routed_scatter());
  CHECK_FALSE(
      config::load(r, {"train.fusions.routed_scatter=false"}).train().fusions().routed_scatter());
}

TEST_CASE("recompute settings parse, and their errors name the field", "[config][errors]") {
  const std::string r = kRecipes + "tiny_mod.textproto";
  auto cfg = config::load(r, {"train.recompute=SELECTIVE", "train.recompute_blocks=[0, 2]"});
  CHECK(cfg.train().recompute() == modtrain::TrainConfig::SELECTIVE);
  CHECK(cfg.train().recompute_blocks_size() == 2);
  CHECK(config::load(r, {}).train().recompute() == modtrain::TrainConfig::NONE);
  CHECK_THROWS_WITH(config::load(r, {"train.recompute=SOME"}),
                    Contains("train.recompute") && Contains("NONE, SELECTIVE, FULL"));
  CHECK_THROWS_WITH(config::parse_text("train { recompute: SOME }", "inline.textproto"),
                    Contains("inline.textproto:1") && Contains("recompute"));
  const int layers = cfg.model().n_layers();
  CHECK_THROWS_WITH(config::load(r, {"train.recompute_blocks=[1, " + std::to_string(layers) + "]"}),
                    Contains("train.recompute_blocks[1]") &&
                        Contains(std::to_string(layers) + " is not a block in [0, " +
                                 std::to_string(layers) + ")"));
  CHECK_THROWS_WITH(config::load(r, {"train.recompute_blocks=-1"}),
                    Contains("train.recompute_blocks[0]") && Contains("-1"));
  // Configs embedded in weights and checkpoints take the same validation.
  modtrain::RunConfig embedded = cfg;
  embedded.mutable_train()->add_recompute_blocks(99);
  CHECK_THROWS_WITH(config::parse_checked(config::to_text(embedded), "weights.meta"),
                    Contains("config weights.meta") && Contains("train.recompute_blocks[2]"));
}

// train.cuda_graph unset: on for one process on CUDA (graphed one-GPU steps have run on GPUs;
// graphed multi-rank ones not yet), off on the CPU or across processes; set, as set.
TEST_CASE("train.cuda_graph defaults to on for one process on CUDA", "[config]") {
  const std::string r = kRecipes + "tiny_dense.textproto";
  CHECK_FALSE(config::cuda_graph_on(config::load(r, {})));
  CHECK(config::cuda_graph_on(config::load(r, {"train.device=CUDA"})));
  CHECK_FALSE(config::cuda_graph_on(config::load(r, {"train.device=CUDA", "parallel.dp=2"})));
  CHECK_FALSE(config::cuda_graph_on(config::load(r, {"train.device=CUDA", "parallel.tp=2"})));
  CHECK_FALSE(config::cuda_graph_on(config::load(r, {"train.device=CUDA", "train.cuda_graph=false"})));
  CHECK(config::cuda_graph_on(
      config::load(r, {"train.device=CUDA", "parallel.dp=2", "train.cuda_graph=true"})));
}

// parallel.zero_stage replaces the boolean parallel.zero1, which old configs keep: true is stage
// 1. Both named is an error naming both, even when they agree; a stage not built names the range.
TEST_CASE("parallel.zero_stage, and the old parallel.zero1 as stage 1", "[config][errors]") {
  const std::string r = kRecipes + "tiny_dense.textproto";
  CHECK(config::zero_stage(config::load(r, {}).parallel()) == 0);
  CHECK(config::zero_stage(config::load(r, {"parallel.zero1=true"}).parallel()) == 1);
  CHECK(config::zero_stage(config::load(r, {"parallel.zero1=false"}).parallel()) == 0);
  CHECK(config::zero_stage(config::load(r, {"parallel.zero_stage=1"}).parallel()) == 1);
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero1=true", "parallel.zero_stage=1"}),
                    Contains("parallel.zero_stage: 1 and parallel.zero1 true (stage 1) are both set"));
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero1=false", "parallel.zero_stage=0"}),
                    Contains("parallel.zero_stage: 0 and parallel.zero1 false (stage 0) are both set"));
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero1=false", "parallel.zero_stage=1"}),
                    Contains("parallel.zero_stage") && Contains("parallel.zero1 false"));
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero1=true", "parallel.zero_stage=0"}),
                    Contains("parallel.zero_stage") && Contains("parallel.zero1 true"));
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero_stage=-1"}),
                    Contains("parallel.zero_stage") && Contains("-1 is not a stage"));
  CHECK(config::zero_stage(config::load(r, {"parallel.zero_stage=2"}).parallel()) == 2);
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero1=true", "parallel.zero_stage=2"}),
                    Contains("parallel.zero_stage") && Contains("parallel.zero1 true"));
  CHECK(config::zero_stage(config::load(r, {"parallel.zero_stage=3", "parallel.dp=2"}).parallel()) == 3);
  CHECK_THROWS_WITH(config::load(r, {"parallel.zero_stage=4"}),
                    Contains("parallel.zero_stage") && Contains("4 is not a stage") &&
                        Contains("3 (and the parameters, gathered per block)"));
}
