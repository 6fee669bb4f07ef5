// Modules: hierarchical parameter names, registration errors, and a small training step through
// Linear layers that actually lowers a loss.
#include "core/nn/module.h"

#include <catch2/catch.hpp>

#include "core/all_ops.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> up, down;
  Mlp(Rng& rng) {
    up = register_module("up", std::make_shared<nn::Linear>(6, 10, true, rng, 0.3));
    down = register_module("down", std::make_shared<nn::Linear>(10, 1, false, rng, 0.3));
  }
  Tensor forward(const Tensor& x) const { return down->forward(mul(up->forward(x), up->forward(x))); }
};
struct Stack : nn::Module {
  std::shared_ptr<Mlp> first, second;
  Stack(Rng& rng) {
    first = register_module("blocks_0", std::make_shared<Mlp>(rng));
    second = register_module("blocks_1", std::make_shared<Mlp>(rng));
  }
};
}  // namespace

TEST_CASE("parameters are named by their path, in registration order", "[module]") {
  Rng rng(1);
  Stack s(rng);
  std::vector<std::string> names;
  for (auto& [n, t] : s.named_parameters()) {
    names.push_back(n);
    CHECK(t.requires_grad());
  }
  CHECK(names == std::vector<std::string>{"blocks_0.up.weight", "blocks_0.up.bias",
                                          "blocks_0.down.weight", "blocks_1.up.weight",
                                          "blocks_1.up.bias", "blocks_1.down.weight"});
  CHECK(s.num_parameters() == 2 * (60 + 10 + 10));
  CHECK(s.parameter("blocks_1.up.bias").shape() == Shape{10});
  CHECK_THROWS_WITH(s.parameter("blocks_2.up.bias"), Contains("blocks_2.up.bias"));
}

TEST_CASE("gradient steps through Linear layers lower the loss", "[module]") {
  Rng rng(2);
  Mlp m(rng);
  Tensor x = randn({16, 6}, rng), target = randn({16, 1}, rng);
  auto loss_fn = [&] {
    Tensor d = sub(m.forward(x), target);
    return mean(mul(d, d));
  };
  const double first = loss_fn().item();
  for (int step = 0; step < 50; ++step) {
    m.zero_grad();
    Tensor loss = loss_fn();
    loss.backward();
    NoGradGuard no_grad;
    for (auto& p : m.parameters()) {
      Tensor p_mut = p;
      backend_of(p).axpy(-0.05, p.grad(), p_mut);
    }
  }
  CHECK(loss_fn().item() < 0.5 * first);
}
