// model.norm: LAYER puts a LayerNorm (gain and bias) in every norm of the model (each block's
// two and the final one), each of them used by the forward, and such a model trains; RMS, the
// default, keeps the parameters it always had.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/transformer.h"
#include "tests/support/tiny_configs.h"

using namespace mod;

namespace {

std::set<std::string> norm_parameter_names(const model::Transformer& m) {
  std::set<std::string> names;
  for (const auto& [name, p] : m.named_parameters())
    if (name.find("norm") != std::string::npos) names.insert(name);
  return names;
}

// Every norm of an n-layer model, with the parameters each kind has.
std::set<std::string> expected_names(int n_layers, bool bias) {
  std::set<std::string> names;
  std::vector<std::string> norms = {"final_norm"};
  for (int b = 0; b < n_layers; ++b)
    for (const char* n : {"norm1", "norm2"})
      norms.push_back("blocks." + std::to_string(b) + "." + n);
  for (const std::string& n : norms) {
    names.insert(n + ".weight");
    if (bias) names.insert(n + ".bias");
  }
  return names;
}

}  // namespace

TEST_CASE("model.norm reaches every norm of the model, and the forward uses each", "[model]") {
  for (bool routed : {false, true}) {
    auto cfg = test::tiny_model(routed);
    INFO((routed ? "MoD" : "dense"));
    CHECK(norm_parameter_names(model::Transformer(cfg, 1)) ==
          expected_names(cfg.n_layers(), /*bias=*/false));

    cfg.set_norm(modtrain::ModelConfig::LAYER);
    model::Transformer m(cfg, 1);
    REQUIRE(norm_parameter_names(m) == expected_names(cfg.n_layers(), /*bias=*/true));
    const Tensor in = test::tokens_for(2, 12, 32, 2), tgt = test::tokens_for(2, 12, 32, 3);
    NoGradGuard no_grad;
    const double base = m.forward(in, tgt).lm_loss.item();
    // A bias only a LayerNorm has moves the loss wherever the forward runs that norm.
    for (const std::string& name : expected_names(cfg.n_layers(), /*bias=*/true)) {
      if (name.find(".bias") == std::string::npos) continue;
      INFO(name);
      Tensor bias = m.parameter(name);
      CHECK(bias.at(0) == 0.0);  // initialised to 0, as GPT-2's
      bias.copy_from(Tensor::full(bias.shape(), 0.5, bias.dtype()));
      CHECK(m.forward(in, tgt).lm_loss.item() != base);
      bias.copy_from(Tensor::zeros(bias.shape(), bias.dtype()));
    }
  }
}

TEST_CASE("a model with LayerNorms trains: its loss falls under plain gradient descent",
          "[model]") {
  auto cfg = test::tiny_model(/*mod=*/true);
  cfg.set_norm(modtrain::ModelConfig::LAYER);
  cfg.set_init_std(0.05);
  model::Transformer m(cfg, 1);
  const Tensor in = test::tokens_for(4, 12, 32, 2), tgt = test::tokens_for(4, 12, 32, 3);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    m.zero_grad();
    const auto r = m.forward(in, tgt);
    r.loss.backward();
    if (step == 0) first = r.lm_loss.item();
    last = r.lm_loss.item();
    NoGradGuard no_grad;
    for (Tensor& p : m.parameters())
      if (p.grad().defined()) p.copy_from(sub(p, scale(p.grad(), 0.5)));
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 3.0);  // about ln 32 = 3.47 at init
  CHECK(last < first - 1.0);
}
