// Training-side checks: tiny dense and MoD models overfit a fixed batch; the schedule and the
// FLOP accounting give hand-computed values; weights round-trip through the weights file.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "core/all_ops.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/adamw.h"
#include "tests/support/overfit.h"
#include "tests/support/tiny_configs.h"
#include "train/data/token_file.h"
#include "train/evaluate.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"
#include "train/weights.h"

using namespace mod;
using Catch::Matchers::Contains;

TEST_CASE("tiny dense and MoD models overfit a fixed batch below loss 0.3", "[train]") {
  for (bool routed : {false, true}) {
    DYNAMIC_SECTION((routed ? "MoD" : "dense")) {
      auto cfg = test::tiny_model(routed);
      cfg.set_init_std(0.05);
      model::Transformer m(cfg, 1);
      const test::OverfitLosses l = test::overfit_fixed_batch(m);
      const double first = l.first, last = l.last;
      INFO("loss " << first << " -> " << last);
      CHECK(first > 3.0);  // about ln 32 = 3.47 at init
      CHECK(last < 0.3);
    }
  }
}

// The norm is sqrt of the f64 sum of every squared entry; above max_norm every gradient is
// scaled by max_norm / (norm + 1e-6), at or below it nothing changes; parameters without a
// gradient are skipped.
TEST_CASE("clip_grad_norm: the global norm, and the scale only above max_norm", "[train]") {
  Rng rng(31);
  std::vector<Tensor> params = {Tensor::zeros({3, 5}), Tensor::zeros({7}), Tensor::zeros({2})};
  for (Tensor& p : params) p.set_requires_grad(true);
  for (size_t i = 0; i < 2; ++i) sum(mul(params[i], randn(params[i].shape(), rng))).backward();
  double sq = 0;
  for (size_t i = 0; i < 2; ++i)
    for (double g : params[i].grad().to_vector()) sq += g * g;
  const double norm = std::sqrt(sq);
  for (double max_norm : {0.0, norm * 2, norm / 3}) {
    INFO("max_norm " << max_norm << ", norm " << norm);
    std::vector<std::vector<double>> before;
    for (size_t i = 0; i < 2; ++i) before.push_back(params[i].grad().to_vector());
    const double got = train::clip_grad_norm(params, max_norm);
    CHECK(got == Approx(norm).epsilon(1e-6));
    const bool clips = max_norm > 0 && norm > max_norm;
    const double f = clips ? static_cast<float>(max_norm / (got + 1e-6)) : 1.0;
    for (size_t i = 0; i < 2; ++i) {
      const auto after = params[i].grad().to_vector();
      for (size_t k = 0; k < after.size(); ++k)
        CHECK(after[k] == static_cast<float>(static_cast<float>(before[i][k]) * static_cast<float>(f)));
      Tensor g = params[i].grad();  // shares the gradient's storage: restores it
      if (clips) g.copy_from(Tensor::from_vector(before[i], params[i].shape()));
    }
    CHECK_FALSE(params[2].grad().defined());
  }
}

// grad_sq_sum is one pass (sum_squares_multi) where it was one sum_squares per gradient into a
// slot of the gradients' dtype, then the slots summed in f64. Per gradient both sum the same
// terms in double; the old path then rounded each gradient's sum to f32, so (all terms positive)
// the two differ by at most 2^-24 of the sum, and the norms by 2^-25. Without that rounding
// (slots in f64) the old path's result is within 1e-12 (on the CPU: equal). Gradients that
// are views (narrow0 slices of one buffer, non-zero offsets) count like any other.
TEST_CASE("grad_sq_sum: one pass, within 2^-24 of the per-gradient path it replaced", "[train]") {
  Rng rng(33);
  const Tensor buffer = randn({5000}, rng);
  std::vector<Tensor> params;
  for (const Shape& s : std::vector<Shape>{{3, 5}, {40000}, {7}, {0}, {64, 33}})
    params.push_back(Tensor::zeros(s).set_requires_grad(true));
  for (Tensor& p : params) {
    if (p.numel() == 7) continue;  // a parameter without a gradient
    p.impl()->grad = randn(p.shape(), rng, DType::F32, 1e-3);
  }
  const Tensor view_param = Tensor::zeros({900}).set_requires_grad(true);
  view_param.impl()->grad = buffer.narrow0(1234, 900);
  params.push_back(view_param);

  double old_f32 = 0, old_f64 = 0, exact = 0;
  for (const Tensor& p : params) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    Tensor slot = Tensor::empty({1}, DType::F32), wide = Tensor::empty({1}, DType::F64);
    backend(Device::CPU).sum_squares(g, slot);
    backend(Device::CPU).sum_squares(g.to(DType::F64), wide);
    old_f32 += slot.at(0);
    old_f64 += wide.at(0);
    for (double v : g.to_vector()) exact += v * v;
  }
  const double got = train::grad_sq_sum(params, Device::CPU).item();
  INFO("relative to the exact sum " << exact << ": one pass " << (got - exact) / exact
                                    << ", per gradient (f32 slots) " << (old_f32 - exact) / exact);
  CHECK(std::abs(got - exact) <= 1e-12 * exact);
  CHECK(std::abs(got - old_f64) <= 1e-12 * old_f64);
  CHECK(std::abs(got - old_f32) <= std::ldexp(1.0, -24) * got);
  CHECK(std::abs(std::sqrt(got) - std::sqrt(old_f32)) <= std::ldexp(1.0, -25) * std::sqrt(got));

  MultiTensorTable table;  // kept between calls, as a training step keeps it
  CHECK(train::grad_sq_sum(params, Device::CPU, table).item() == got);
  CHECK(train::grad_sq_sum(params, Device::CPU, table).item() == got);
  CHECK(train::grad_sq_sum({}, Device::CPU, table).item() == 0.0);
  params.push_back(Tensor::zeros({2}, DType::F64).set_requires_grad(true));
  params.back().impl()->grad = Tensor::zeros({2}, DType::F64);
  CHECK_THROWS_WITH(train::grad_sq_sum(params, Device::CPU),
                    Contains("grad_sq_sum") && Contains("in dtype or device"));
}

TEST_CASE("learning rate: linear warm-up, then cosine to min_lr", "[train]") {
  modtrain::OptimizerConfig o;
  o.set_lr(1.0);
  o.set_min_lr(0.1);
  o.set_warmup_steps(10);
  CHECK(train::learning_rate(o, 0, 110) == Approx(0.1));
  CHECK(train::learning_rate(o, 9, 110) == Approx(1.0));
  CHECK(train::learning_rate(o, 60, 110) == Approx(0.55));
  CHECK(train::learning_rate(o, 110, 110) == Approx(0.1));
}

// optimizer.decay_policy: each policy decays exactly the tensors docs/training.md lists (one of
// every kind a model has: attention, MLP, MoD router and predictor, MoE router and experts, an
// untied head, the embedding, norms and biases), and the older switches keep their meaning.
TEST_CASE("weight decay policies decay exactly their listed tensors", "[train]") {
  using Policy = modtrain::OptimizerConfig;
  const std::vector<std::string> matrices = {
      "blocks.0.attn.wq.weight",       "blocks.0.attn.wo.weight",
      "blocks.0.mlp.up.weight",        "blocks.0.mlp.down.weight",
      "blocks.0.mlp.gate.weight",      "blocks.1.router.proj.weight",
      "blocks.1.predictor.in.weight",  "blocks.1.predictor.out.weight",
      "blocks.2.mlp.router.weight",    "blocks.2.mlp.experts.up",
      "lm_head.weight"};
  const std::vector<std::string> embedding = {"embed.weight"};
  const std::vector<std::string> norms_and_biases = {
      "blocks.0.norm1.weight", "blocks.0.norm2.bias",         "final_norm.weight",
      "blocks.1.router.proj.bias", "blocks.1.predictor.in.bias", "blocks.1.predictor.out.bias"};
  auto check = [&](const modtrain::OptimizerConfig& o, bool embed, bool rest) {
    for (const auto& n : matrices) CHECK(parallel::takes_weight_decay(n, o));
    for (const auto& n : embedding) CHECK(parallel::takes_weight_decay(n, o) == embed);
    for (const auto& n : norms_and_biases) CHECK(parallel::takes_weight_decay(n, o) == rest);
  };
  modtrain::OptimizerConfig o;
  SECTION("MATRICES, the default") { check(o, false, false); }
  SECTION("MATRICES_AND_EMBEDDING") {
    o.set_decay_policy(Policy::MATRICES_AND_EMBEDDING);
    check(o, true, false);
  }
  SECTION("ALL") {
    o.set_decay_policy(Policy::ALL);
    check(o, true, true);
  }
  SECTION("the older switches") {
    o.set_decay_embeddings(true);
    check(o, true, false);
    o.set_decay_embeddings(false);
    o.set_decay_norms_and_biases(true);
    check(o, false, true);
  }
}

TEST_CASE("a run's start line says what weight decay decays", "[train]") {
  const modtrain::ModelConfig m = test::tiny_model(true);  // tied embedding, RMSNorm, a predictor
  modtrain::OptimizerConfig o;
  const std::string line = parallel::describe_weight_decay(m, o);
  CHECK_THAT(line, Catch::StartsWith("weight decay 0.1 (MATRICES): "));
  CHECK_THAT(line, Catch::EndsWith("(the embedding, norms and biases)"));
  o.set_decay_policy(modtrain::OptimizerConfig::ALL);
  CHECK_THAT(parallel::describe_weight_decay(m, o), Catch::EndsWith("not decayed: 0.00M in 0"));
}

TEST_CASE("FLOP accounting matches a hand count, and MoD blocks cost their capacity share",
          "[flops]") {
  auto dense = test::tiny_model(false);  // D 16, ff 32, V 32, S 12, 2 blocks, GELU
  const auto f = model::count_flops(dense);
  const double block = 8.0 * 16 * 16 + 4.0 * 16 * 32 + 2.0 * 16 * 13;  // proj + mlp + attn
  CHECK(f.blocks[0].forward_per_token == Approx(block));
  CHECK(f.forward_per_token == Approx(2 * block + 2.0 * 16 * 32));
  CHECK(f.training_per_token == Approx(3 * f.forward_per_token));
  CHECK(f.parameters == 32 * 16 + 2 * (4 * 256 + 2 * 16 * 32 + 32) + 16);

  auto routed = test::tiny_model(true);  // block 1 routed, C = 3, predictor hidden 8
  const auto g = model::count_flops(routed);
  CHECK(g.blocks[1].capacity == 3);
  const double routed_block = (8.0 * 256 + 4.0 * 16 * 32 + 2.0 * 16 * 4) * 3 / 12;
  CHECK(g.blocks[1].forward_per_token == Approx(routed_block + 2 * 16 + 2 * 16 * 8 + 2 * 8));
  CHECK(g.forward_per_token < f.forward_per_token);
}

TEST_CASE("weights round-trip through the weights file, and bad files are named", "[train]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("modtrain_w_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  modtrain::RunConfig cfg;
  *cfg.mutable_model() = test::tiny_model(true);
  model::Transformer m(cfg.model(), 5);
  const std::string path = (dir / "model.safetensors").string();
  train::save_weights(path, m, cfg, 42);
  auto loaded = train::load_weights(path);
  CHECK(loaded.step == 42);
  CHECK(loaded.config.model().mod().enabled());
  for (auto& [name, p] : m.named_parameters()) {
    INFO(name);
    CHECK(p.to_vector() == loaded.model->parameter(name).to_vector());
  }
  fs::resize_file(path, fs::file_size(path) - 8);
  CHECK_THROWS_WITH(train::load_weights(path), Contains("model.safetensors"));
  fs::remove_all(dir);
}

// Well-formed weights holding NaN used to load silently: eval printed "-nan" and exited 0, and
// greedy sampling repeated the argmax of NaN. Loading refuses them naming the tensor and the
// element, and --allow-non-finite opens them for a look; evaluation then names the batch.
TEST_CASE("weights holding NaN or infinities are refused naming the tensor and the element",
          "[train]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("modtrain_nan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  modtrain::RunConfig cfg;
  *cfg.mutable_model() = test::tiny_model(true);
  model::Transformer m(cfg.model(), 5);
  Tensor wq = m.parameter("blocks.0.attn.wq.weight");
  wq.data<float>()[1 * wq.size(1) + 2] = std::nanf("");
  const std::string path = (dir / "model.safetensors").string();
  train::save_weights(path, m, cfg, 7);
  CHECK_THROWS_WITH(train::load_weights(path),
                    Contains("weights " + path) && Contains("blocks.0.attn.wq.weight") &&
                        Contains("NaN at [1, 2]") && Contains("--allow-non-finite"));
  CHECK_THROWS_WITH(train::load_model(dir.string()), Contains("blocks.0.attn.wq.weight"));
  train::LoadChecks allow;
  allow.allow_non_finite = true;
  auto loaded = train::load_weights(path, allow);
  CHECK(std::isnan(loaded.model->parameter("blocks.0.attn.wq.weight").to_vector()[wq.size(1) + 2]));
  wq.data<float>()[1 * wq.size(1) + 2] = -INFINITY;
  train::save_weights(path, m, cfg, 7);
  CHECK_THROWS_WITH(train::load_weights(path), Contains("an infinity at [1, 2]"));
  fs::remove_all(dir);
}

// A non-finite loss in evaluation used to be averaged into "-nan" and printed; it stops the
// evaluation, naming the split, the batch and the routing.
TEST_CASE("evaluation stops at a non-finite loss, naming the batch and the routing", "[train]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("modtrain_evalnan_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7) % 32);
  data::write_shard((dir / "train.bin").string(), tokens, 32);
  data::write_shard((dir / "val.bin").string(), tokens, 32);
  const data::Dataset d = train::load_dataset(dir.string(), 32);
  model::Transformer m(test::tiny_model(false), 5);  // vocab 32, seq_len 12
  const auto ok = train::evaluate(m, d.val, 12, 2, 3, model::RoutingMode::TopC);
  CHECK(std::isfinite(ok.loss));
  m.parameter("final_norm.weight").data<float>()[0] = std::nanf("");
  CHECK_THROWS_WITH(train::evaluate(m, d.val, 12, 2, 3, model::RoutingMode::TopC),
                    Contains("batch 0 of 3") && Contains("non-finite loss with top-C routing") &&
                        Contains("val"));
  fs::remove_all(dir);
}
