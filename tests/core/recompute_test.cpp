// Recompute regions: gradients equal the unchecked graph's bit for bit (f64 and f32, both ways
// of keeping), several outputs, a parameter used inside and outside a region, on_leaf_ready once
// per leaf after its last contribution, the forward's autocast state in the recomputation.
#include "core/recompute.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"

using namespace mod;

namespace {

enum class Mode { Plain, InputsOnly, CostlyOutputs };

// Runs fn directly (Plain) or as a recompute region keeping what the mode says.
std::vector<Tensor> region(Mode mode, const RegionFn& fn, const std::vector<Tensor>& inputs) {
  if (mode == Mode::Plain) return fn(inputs);
  return recompute_region(
      fn, inputs,
      mode == Mode::InputsOnly ? RegionKeeps::InputsOnly : RegionKeeps::CostlyOpOutputs);
}

struct Params {
  Tensor x, w1, w2, w_out;  // x: an input leaf; the others are parameters
};

Params make_params(DType dtype) {
  Rng rng(7);
  return {randn({2, 5, 6}, rng, dtype).set_requires_grad(true),
          randn({9, 6}, rng, dtype, 0.4).set_requires_grad(true),
          randn({6, 9}, rng, dtype, 0.4).set_requires_grad(true),
          randn({3, 6}, rng, dtype, 0.4).set_requires_grad(true)};
}

// Two residual blocks y = x + W2 silu(gelu(W1 x)), then a head; returns every
// gradient and the loss as host vectors.
std::map<std::string, std::vector<double>> run(Mode mode, DType dtype,
                                               const LeafGradReady& ready = nullptr) {
  Params p = make_params(dtype);
  const Tensor w1 = p.w1, w2 = p.w2;
  RegionFn block = [w1, w2](const std::vector<Tensor>& in) {
    Tensor h = gelu(matmul(in[0], w1, false, true));
    return std::vector<Tensor>{add(in[0], matmul(silu(h), w2, false, true))};
  };
  Tensor x = p.x;
  for (int i = 0; i < 2; ++i) x = region(mode, block, {x})[0];
  Tensor head = matmul(x, p.w_out, false, true);
  // w1 is used outside the regions too: its last contribution comes from the first region.
  Tensor loss = add(mean(mul(head, head)), mean(matmul(x, p.w1, false, true)));
  backward(loss, Tensor(), ready);
  return {{"loss", loss.to_vector()},
          {"x", p.x.grad().to_vector()},
          {"w1", p.w1.grad().to_vector()},
          {"w2", p.w2.grad().to_vector()},
          {"w_out", p.w_out.grad().to_vector()}};
}

}  // namespace

TEST_CASE("recomputed gradients equal the plain graph's bitwise", "[autograd][recompute]") {
  for (DType dtype : {DType::F64, DType::F32}) {
    const auto plain = run(Mode::Plain, dtype);
    for (Mode mode : {Mode::InputsOnly, Mode::CostlyOutputs}) {
      INFO("dtype " << dtype_name(dtype) << ", mode " << static_cast<int>(mode));
      const auto checked = run(mode, dtype);
      for (const auto& [name, values] : plain) {
        INFO(name);
        CHECK(checked.at(name) == values);
      }
    }
  }
}

TEST_CASE("a region with several outputs runs its backward once, after all arrived",
          "[autograd][recompute]") {
  auto grads = [](Mode mode) {
    Rng rng(3);
    Tensor x = randn({4, 5}, rng, DType::F64).set_requires_grad(true);
    Tensor w = randn({5, 5}, rng, DType::F64).set_requires_grad(true);
    int runs = 0;
    RegionFn fn = [w, &runs](const std::vector<Tensor>& in) {
      ++runs;
      Tensor h = matmul(in[0], w);
      // the third output is never used: it gets no gradient and seeds nothing
      return std::vector<Tensor>{sigmoid(h), mean(mul(h, h)), gelu(h)};
    };
    std::vector<Tensor> out = region(mode, fn, {x});
    Tensor loss = add(sum(mul(out[0], x)), scale(out[1], 0.25));  // x also used outside
    loss.backward();
    if (mode != Mode::Plain) CHECK(runs == 2);  // forward + one recomputation
    return std::vector<std::vector<double>>{x.grad().to_vector(), w.grad().to_vector()};
  };
  const auto plain = grads(Mode::Plain);
  CHECK(grads(Mode::InputsOnly) == plain);
  CHECK(grads(Mode::CostlyOutputs) == plain);
}

TEST_CASE("a parameter used inside and outside a region gets both contributions",
          "[autograd][recompute]") {
  auto grads = [](Mode mode) {
    Rng rng(5);
    Tensor x = randn({3, 4}, rng, DType::F32).set_requires_grad(true);
    Tensor w = randn({4, 4}, rng, DType::F32).set_requires_grad(true);
    RegionFn fn = [w](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{gelu(matmul(in[0], w))};
    };
    Tensor inside = region(mode, fn, {x})[0];
    Tensor loss = add(sum(mul(inside, inside)), sum(matmul(inside, w)));
    loss.backward();
    return std::vector<std::vector<double>>{x.grad().to_vector(), w.grad().to_vector()};
  };
  const auto plain = grads(Mode::Plain);
  CHECK(grads(Mode::InputsOnly) == plain);
  CHECK(grads(Mode::CostlyOutputs) == plain);
}

TEST_CASE("on_leaf_ready fires once per leaf, after the region's contribution",
          "[autograd][recompute]") {
  for (Mode mode : {Mode::Plain, Mode::InputsOnly, Mode::CostlyOutputs}) {
    INFO("mode " << static_cast<int>(mode));
    std::map<TensorImpl*, int> fired;
    std::map<TensorImpl*, std::vector<double>> at_fire;
    const auto grads = run(mode, DType::F64, [&](const Tensor& leaf) {
      ++fired[leaf.impl()];
      at_fire[leaf.impl()] = leaf.grad().to_vector();
    });
    REQUIRE(fired.size() == 4);  // x, w1, w2, w_out
    for (const auto& [leaf, n] : fired) CHECK(n == 1);
    // Nothing was added after a leaf was reported: every reported value is a final gradient.
    std::vector<std::vector<double>> finals;
    for (const char* name : {"x", "w1", "w2", "w_out"}) finals.push_back(grads.at(name));
    for (const auto& [leaf, values] : at_fire)
      CHECK(std::find(finals.begin(), finals.end(), values) != finals.end());
  }
}

TEST_CASE("the recomputation runs under the forward's autocast state", "[autograd][recompute]") {
  auto grads = [](Mode mode) {
    Rng rng(11);
    Tensor x = randn({3, 4}, rng, DType::F64).set_requires_grad(true);
    Tensor w = randn({4, 4}, rng, DType::F64).set_requires_grad(true);
    RegionFn fn = [w](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{gelu(matmul(autocast(in[0]), autocast(w)))};
    };
    Tensor y;
    {
      AutocastGuard narrow(DType::F32);  // backward below runs outside it
      y = region(mode, fn, {x})[0];
    }
    sum(mul(y, y)).backward();
    return std::vector<std::vector<double>>{x.grad().to_vector(), w.grad().to_vector()};
  };
  const auto plain = grads(Mode::Plain);
  CHECK(grads(Mode::InputsOnly) == plain);
  CHECK(grads(Mode::CostlyOutputs) == plain);
}

TEST_CASE("outside grad mode a region is its function", "[autograd][recompute]") {
  Rng rng(2);
  Tensor x = randn({2, 3}, rng, DType::F64).set_requires_grad(true);
  NoGradGuard no_grad;
  const Tensor y = recompute_region(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0])}; }, {x})[0];
  CHECK_FALSE(y.requires_grad());
  CHECK(y.to_vector() == gelu(x).to_vector());
}

TEST_CASE("a second backward through a region is an error", "[autograd][recompute]") {
  Rng rng(2);
  Tensor x = randn({2, 3}, rng, DType::F64).set_requires_grad(true);
  const Tensor y = recompute_region(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(gelu(in[0]))}; }, {x})[0];
  y.backward();
  CHECK_THROWS_WITH(y.backward(), Catch::Matchers::Contains("a second time"));
}
