// The fused GELU MLP (gelu_mlp) against linear, gelu, linear: the output and every gradient bit
// for bit in f32 and f64, on rows below and past the OpenMP threshold; weights read as leaves
// (their gradients added in place over two backward passes) and through another op; with x
// alone or the weights alone requiring grad; inside recompute regions of both kinds; argument
// errors. Its float64 finite-difference cases are in grad_cases_basic.cpp.
#include <catch2/catch.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "core/recompute.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {

struct Setup {
  DType dtype = DType::F32;
  Shape x = {2, 3, 8};
  int64_t f = 12;
  bool leaf_weights = true;      // false: the op reads scale(w, 1), not the leaf
  bool x_grad = true, w_grad = true;
  int passes = 1;                // backward passes (gradients accumulate)
  std::optional<RegionKeeps> region;
};

struct Outcome {
  std::vector<double> y, grads;  // grads: x, w_up, w_down (those requiring grad), in order
};

Outcome run(bool fused, const Setup& s) {
  Rng rng(17);
  const int64_t d = s.x.back();
  Tensor x = randn(s.x, rng, DType::F64, 1.5).to(s.dtype).set_requires_grad(s.x_grad);
  Tensor up = randn({s.f, d}, rng, DType::F64, 0.5).to(s.dtype).set_requires_grad(s.w_grad);
  Tensor down = randn({d, s.f}, rng, DType::F64, 0.5).to(s.dtype).set_requires_grad(s.w_grad);
  const Tensor r = randn(s.x, rng, s.dtype);
  Outcome o;
  for (int pass = 0; pass < s.passes; ++pass) {
    RegionFn fn = [&](const std::vector<Tensor>& in) {
      const Tensor u = s.leaf_weights ? up : scale(up, 1.0);
      const Tensor w = s.leaf_weights ? down : scale(down, 1.0);
      return std::vector<Tensor>{fused ? gelu_mlp(in[0], u, w) : linear(gelu(linear(in[0], u)), w)};
    };
    const Tensor y = s.region ? recompute_region(fn, {x}, *s.region)[0] : fn({x})[0];
    backward(sum(mul(y, r)));
    o.y = y.to_vector();
  }
  for (const Tensor* p : {&x, &up, &down})
    if (p->requires_grad()) {
      const std::vector<double> g = p->grad().to_vector();
      o.grads.insert(o.grads.end(), g.begin(), g.end());
    }
  return o;
}

void check_same(const Setup& s) {
  const Outcome unfused = run(false, s), fused = run(true, s);
  REQUIRE(fused.y.size() == unfused.y.size());
  REQUIRE(fused.grads.size() == unfused.grads.size());
  for (size_t i = 0; i < fused.y.size(); ++i) {
    INFO("y[" << i << "]");
    REQUIRE(fused.y[i] == unfused.y[i]);
  }
  for (size_t i = 0; i < fused.grads.size(); ++i) {
    INFO("gradient entry " << i);
    REQUIRE(fused.grads[i] == unfused.grads[i]);
  }
}

}  // namespace

TEST_CASE("gelu_mlp equals linear, gelu, linear bit for bit (f32 and f64, small and large rows)",
          "[ops][gelu_mlp]") {
  for (DType dtype : {DType::F32, DType::F64})
    for (const auto& [x, f] : std::vector<std::pair<Shape, int64_t>>{
             {{2, 3, 8}, 12}, {{5, 7}, 3}, {{2, 160, 64}, 256}}) {
      INFO(dtype_name(dtype) << " x " << shape_str(x) << " F " << f);
      Setup s;
      s.dtype = dtype;
      s.x = x;
      s.f = f;
      check_same(s);
    }
}

TEST_CASE("gelu_mlp's weight gradients accumulate over passes as matmul's do, leaf or not",
          "[ops][gelu_mlp]") {
  for (bool leaf : {true, false}) {
    INFO((leaf ? "leaf weights" : "weights through scale()"));
    Setup s;
    s.leaf_weights = leaf;
    s.passes = 2;
    check_same(s);
  }
}

TEST_CASE("gelu_mlp with only x, or only the weights, requiring grad", "[ops][gelu_mlp]") {
  Setup only_x;
  only_x.w_grad = false;
  check_same(only_x);
  Setup only_w;
  only_w.x_grad = false;
  check_same(only_w);
}

TEST_CASE("gelu_mlp inside recompute regions equals the unfused ops without one",
          "[ops][gelu_mlp][recompute]") {
  for (RegionKeeps keeps : {RegionKeeps::InputsOnly, RegionKeeps::CostlyOpOutputs}) {
    INFO((keeps == RegionKeeps::InputsOnly ? "inputs only" : "costly op outputs"));
    Setup plain, region;
    region.region = keeps;
    const Outcome want = run(false, plain), got = run(true, region);
    CHECK(got.y == want.y);
    CHECK(got.grads == want.grads);
  }
}

TEST_CASE("gelu_mlp names the shapes it cannot multiply", "[ops][gelu_mlp]") {
  const Tensor x = Tensor::zeros({2, 4}, DType::F32);
  CHECK_THROWS_WITH(gelu_mlp(x, Tensor::zeros({6, 5}, DType::F32), Tensor::zeros({4, 6}, DType::F32)),
                    Contains("gelu_mlp") && Contains("w_up [6, 5]") && Contains("[F, D]"));
  CHECK_THROWS_WITH(gelu_mlp(x, Tensor::zeros({6, 4}, DType::F32), Tensor::zeros({4, 7}, DType::F32)),
                    Contains("w_down [4, 7]"));
  CHECK_THROWS_WITH(gelu_mlp(x, Tensor::zeros({6, 4}, DType::F64), Tensor::zeros({4, 6}, DType::F32)),
                    Contains("gelu_mlp") && Contains("w_up"));
  CHECK_THROWS_WITH(gelu_mlp(Tensor::zeros({4}, DType::F32), Tensor::zeros({6, 4}, DType::F32),
                             Tensor::zeros({4, 6}, DType::F32)),
                    Contains("x [4]"));
}
