// The fused step's switches (train.fusions add_norm, gelu_mlp, router_scores, routed_scatter):
// the transformer with the residual add fused into the norm after it, its GELU MLPs as one op,
// or a routed block's gate, scatter and residual add as one op gives the unfused model's losses,
// routing and gradients bit for bit on the CPU, for tiny_dense and tiny_mod (and MoDE), RMSNorm
// and LayerNorm, under every train.recompute mode and a partial recompute_blocks; and it runs
// the fused ops where the plan says (docs/gpu.md "Fused ops").
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/cpu/op_trace.h"
#include "core/random.h"
#include "model/layers.h"
#include "model/transformer.h"
#include "tests/support/step_outcome.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::model;
using modtrain::TrainConfig;

namespace {

// recipe's model at seq_len 128 (batch 2: 256 rows of 256, past the CPU kernels' OpenMP
// threshold) with model.norm = norm.
modtrain::ModelConfig recipe_model(const std::string& recipe, const std::string& norm) {
  const char* src = std::getenv("MOD_SOURCE_DIR");
  return config::load(std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/" + recipe +
                          ".textproto",
                      {"model.seq_len=128", "model.norm=" + norm})
      .model();
}

test::StepOutcome train_step(const modtrain::ModelConfig& cfg, Fusions fusions, Recompute mode,
                             const std::vector<int>& blocks = {}) {
  Transformer model(cfg, 42, DType::F32, fusions);
  model.set_recompute(mode, blocks);
  return test::two_micro_batch_step(model, cfg);
}

// Every fusion off but add_norm = fused.
test::StepOutcome train_step(const modtrain::ModelConfig& cfg, bool fused, Recompute mode,
                             const std::vector<int>& blocks = {}) {
  Fusions fusions;
  fusions.add_norm = fused;
  fusions.gelu_mlp = false;
  return train_step(cfg, fusions, mode, blocks);
}

// How many times the CPU ran each kernel in one forward and backward.
std::map<std::string, int> kernel_counts(const modtrain::ModelConfig& cfg, bool fused) {
  Fusions fusions;
  fusions.add_norm = fused;
  fusions.gelu_mlp = false;
  Transformer model(cfg, 42, DType::F32, fusions);
  const Tensor tokens = test::tokens_for(1, 16, cfg.vocab_size(), 1);
  cpu::start_op_trace();
  backward(model.forward(tokens, tokens).loss);
  std::map<std::string, int> counts;
  for (const DeviceActivity& a : cpu::stop_op_trace()) ++counts[a.name];
  return counts;
}

}  // namespace

TEST_CASE("the fused add + norm trains tiny_dense and tiny_mod as the separate ops, bit for bit",
          "[model][fusion]") {
  for (const char* recipe : {"tiny_dense", "tiny_mod"})
    for (const char* norm : {"RMS", "LAYER"}) {
      const modtrain::ModelConfig cfg = recipe_model(recipe, norm);
      const test::StepOutcome unfused = train_step(cfg, false, TrainConfig::NONE);
      for (Recompute mode : {TrainConfig::NONE, TrainConfig::SELECTIVE, TrainConfig::FULL}) {
        INFO(recipe << ", model.norm " << norm << ", train.recompute "
                    << TrainConfig::Recompute_Name(mode));
        test::check_same(train_step(cfg, true, mode), unfused);
      }
    }
}

// Block 2 recomputed, its neighbours not: block 1's last add cannot make block 2's norm1 (the
// region takes x alone), block 2's region outputs block 3's norm1 beside x.
TEST_CASE("the fused add + norm around a recomputed block among kept ones", "[model][fusion]") {
  const modtrain::ModelConfig cfg = recipe_model("tiny_dense", "RMS");
  const test::StepOutcome unfused = train_step(cfg, false, TrainConfig::NONE);
  for (Recompute mode : {TrainConfig::SELECTIVE, TrainConfig::FULL}) {
    INFO("train.recompute " << TrainConfig::Recompute_Name(mode) << " of block 2");
    test::check_same(train_step(cfg, true, mode, {2}), unfused);
  }
}

// tiny_dense (6 dense blocks): norm2 in each block, norm1 of blocks 1-5 and the final norm come
// from the fused op, block 0's norm1 alone. tiny_mod (blocks 1, 3, 5 routed): only norm2 is
// fused; norm1 of every block and the final norm follow a scatter or the embedding.
TEST_CASE("the transformer fuses every residual add that a norm follows", "[model][fusion]") {
  struct Expect {
    const char* recipe;
    int fused, alone;  // add_rmsnorm and rmsnorm kernels per forward
  };
  for (Expect e : {Expect{"tiny_dense", 12, 1}, Expect{"tiny_mod", 6, 7}}) {
    INFO(e.recipe);
    const modtrain::ModelConfig cfg = recipe_model(e.recipe, "RMS");
    std::map<std::string, int> on = kernel_counts(cfg, true), off = kernel_counts(cfg, false);
    CHECK(on["add_rmsnorm_forward"] == e.fused);
    CHECK(on["add_rmsnorm_backward"] == e.fused);
    CHECK(on["rmsnorm_forward"] == e.alone);
    CHECK(off["add_rmsnorm_forward"] == 0);
    CHECK(off["rmsnorm_forward"] == e.fused + e.alone);
    CHECK(on["binary add"] == off["binary add"] - e.fused);
    CHECK(on["axpy"] < off["axpy"]);  // the sums of s's gradients went into the fused backward
  }
}

// Nodes recorded for `op` in the graph that produced t.
int count_nodes(const Tensor& t, Op op) {
  std::set<const Node*> seen;
  std::vector<std::shared_ptr<Node>> todo = {t.grad_fn()};
  int n = 0;
  while (!todo.empty()) {
    std::shared_ptr<Node> node = todo.back();
    todo.pop_back();
    if (!node || !seen.insert(node.get()).second) continue;
    n += node->op == op;
    for (const Edge& e : node->inputs) todo.push_back(e.node);
  }
  return n;
}

TEST_CASE("the fused GELU MLP trains tiny_dense and tiny_mod as the separate ops, bit for bit",
          "[model][fusion]") {
  for (const char* recipe : {"tiny_dense", "tiny_mod"}) {
    const modtrain::ModelConfig cfg = recipe_model(recipe, "RMS");
    Fusions off, on;
    off.gelu_mlp = false;
    const test::StepOutcome unfused = train_step(cfg, off, TrainConfig::NONE);
    for (Recompute mode : {TrainConfig::NONE, TrainConfig::SELECTIVE, TrainConfig::FULL}) {
      INFO(recipe << ", train.recompute " << TrainConfig::Recompute_Name(mode));
      test::check_same(train_step(cfg, on, mode), unfused);
    }
  }
}

// Every dense MLP runs as one gelu_mlp: tiny_dense's 6 blocks, tiny_mod's 6 (3 of them on the
// routed rows); a SwiGLU model keeps its separate ops.
TEST_CASE("the transformer runs every GELU MLP as gelu_mlp, and SwiGLU ones unfused",
          "[model][fusion]") {
  for (const char* recipe : {"tiny_dense", "tiny_mod"}) {
    INFO(recipe);
    const modtrain::ModelConfig cfg = recipe_model(recipe, "RMS");
    for (bool fused : {true, false}) {
      Fusions fusions;
      fusions.gelu_mlp = fused;
      Transformer model(cfg, 42, DType::F32, fusions);
      const Tensor tokens = test::tokens_for(1, 16, cfg.vocab_size(), 1);
      const Tensor loss = model.forward(tokens, tokens).loss;
      CHECK(count_nodes(loss, Op::GeluMlp) == (fused ? cfg.n_layers() : 0));
      CHECK(count_nodes(loss, Op::GELU) == (fused ? 0 : cfg.n_layers()));
    }
  }
  modtrain::ModelConfig swiglu = recipe_model("tiny_dense", "RMS");
  swiglu.set_mlp(modtrain::ModelConfig::SWIGLU);
  Transformer model(swiglu, 42, DType::F32, Fusions{});
  const Tensor tokens = test::tokens_for(1, 16, swiglu.vocab_size(), 1);
  const Tensor loss = model.forward(tokens, tokens).loss;
  CHECK(count_nodes(loss, Op::GeluMlp) == 0);
  CHECK(count_nodes(loss, Op::SwiGLU) == swiglu.n_layers());
}

// train.fusions.router_scores acts where activations are narrower than the master weights: here
// f64 weights under an f32 autocast stand for f32 under bf16 (a whole model cannot: its losses
// would mix f32 and f64). The router's scores (with and without a bias) and the predictor's
// logit from row_scores equal cast then linear bit for bit, values and every gradient, and the
// fused op runs only where the input is narrower.
TEST_CASE("row_scores in the router and predictor equals cast then linear, bit for bit",
          "[model][fusion]") {
  for (bool bias : {false, true}) {
    INFO("router bias " << bias);
    struct Out {
      std::vector<double> values, grads;
      int row_scores_nodes = 0;
    };
    auto run = [&](bool fused, bool narrow) {
      Rng rng(5);
      Router router(48, bias, rng, 0.2, DType::F64, fused);
      Predictor predictor(48, 16, rng, 0.2, DType::F64, fused);
      Tensor x = randn({2, 9, 48}, rng, DType::F64).to(narrow ? DType::F32 : DType::F64);
      x.set_requires_grad(true);
      std::optional<AutocastGuard> guard;
      if (narrow) guard.emplace(DType::F32);
      const Tensor r = router.scores(x), p = predictor.logits(x);
      const Tensor loss = add(sum(mul(r, r)), sum(p));
      Out o;
      o.row_scores_nodes = count_nodes(loss, Op::RowScores);
      backward(loss);
      o.values = r.to_vector();
      for (double v : p.to_vector()) o.values.push_back(v);
      for (const Tensor* t : {&x}) o.grads = t->grad().to_vector();
      for (const auto* m : {static_cast<const nn::Module*>(&router),
                            static_cast<const nn::Module*>(&predictor)})
        for (const auto& [name, param] : m->named_parameters())
          for (double g : param.grad().to_vector()) o.grads.push_back(g);
      return o;
    };
    const Out unfused = run(false, true), fused = run(true, true);
    CHECK(fused.values == unfused.values);
    CHECK(fused.grads == unfused.grads);
    CHECK(fused.row_scores_nodes == 2);  // the router and the predictor's logit layer
    CHECK(unfused.row_scores_nodes == 0);
    CHECK(run(true, false).row_scores_nodes == 0);  // not narrower: linear as before
  }
}

// train.fusions.routed_scatter: a routed block's gate multiply, scatter and residual add as one
// scatter_gated_rows gives the separate mul and scatter_add_rows's step bit for bit, for tiny_mod
// (predictor and aux-BCE) and both MoDE recipes; under recompute the product stays inside the
// region (the unfused ops), so those steps equal it too.
TEST_CASE("the routed blocks' fused gate, scatter and residual add train as the separate ops",
          "[model][fusion]") {
  for (const char* recipe : {"tiny_mod", "tiny_mode_integrated", "tiny_mode_staged"})
    for (const char* method : {"PREDICTOR", "AUX_BCE"}) {
      if (std::string(recipe) != "tiny_mod" && std::string(method) == "AUX_BCE") continue;
      modtrain::ModelConfig cfg = recipe_model(recipe, "RMS");
      modtrain::CausalRoutingConfig::Method m;
      REQUIRE(modtrain::CausalRoutingConfig::Method_Parse(method, &m));
      cfg.mutable_mod()->mutable_causal()->set_method(m);
      Fusions off, on;
      off.routed_scatter = false;
      const test::StepOutcome unfused = train_step(cfg, off, TrainConfig::NONE);
      for (Recompute mode : {TrainConfig::NONE, TrainConfig::SELECTIVE, TrainConfig::FULL}) {
        INFO(recipe << ", " << method << ", train.recompute " << TrainConfig::Recompute_Name(mode));
        test::check_same(train_step(cfg, on, mode), unfused);
      }
    }
}

// One scatter_gated_rows per routed block where the block is not recomputed, none where it is,
// and no mul of the gate left beside it.
TEST_CASE("the transformer runs scatter_gated_rows in every routed block not recomputed",
          "[model][fusion]") {
  const modtrain::ModelConfig cfg = recipe_model("tiny_mod", "RMS");
  int routed = 0;
  const Transformer plain(cfg, 42, DType::F32, Fusions{});
  for (int b = 0; b < cfg.n_layers(); ++b) routed += plain.routed(b);
  REQUIRE(routed > 0);
  const Tensor tokens = test::tokens_for(1, 16, cfg.vocab_size(), 1);
  auto nodes = [&](bool fused, Recompute mode, Op op) {
    Fusions fusions;
    fusions.routed_scatter = fused;
    Transformer model(cfg, 42, DType::F32, fusions);
    model.set_recompute(mode, {});
    return count_nodes(model.forward(tokens, tokens).loss, op);
  };
  CHECK(nodes(true, TrainConfig::NONE, Op::ScatterGatedRows) == routed);
  CHECK(nodes(true, TrainConfig::NONE, Op::ScatterAddRows) == 0);
  CHECK(nodes(false, TrainConfig::NONE, Op::ScatterGatedRows) == 0);
  CHECK(nodes(false, TrainConfig::NONE, Op::ScatterAddRows) == routed);
  CHECK(nodes(true, TrainConfig::FULL, Op::ScatterGatedRows) == 0);
  CHECK(nodes(true, TrainConfig::NONE, Op::Mul) + routed == nodes(false, TrainConfig::NONE, Op::Mul));
}
