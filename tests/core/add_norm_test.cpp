// The fused residual add + norm (add_rmsnorm, add_layernorm) against add() then the norm: both
// outputs and every gradient bit for bit in f32 and f64, on rows below and past the OpenMP
// threshold, whichever outputs reach the loss (where the sum has two further uses, its gradient
// adds three terms in another order: to rounding); inside a recompute region; argument errors.
// Its float64 finite-difference cases are in grad_cases_norm_act_softmax.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
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

// Which outputs reach the loss: both, the norm only (the final norm's case), the sum only, or
// the sum with two further uses (its gradient is a sum before the fused backward sees it).
enum class Uses { Both, NormedOnly, SumOnly, SumTwice };

struct Outcome {
  std::vector<double> sum, normed, grads;  // grads: x, a, weight (, bias), in order
};

// x, a [rows, d]; weight (and bias) [d]; r1, r2 fixed weights for the loss.
// keeps: run inside a recompute region that keeps this; none: no region.
Outcome run(bool fused, bool layer, Uses uses, DType dtype, const Shape& shape,
            std::optional<RegionKeeps> keeps = std::nullopt) {
  Rng rng(31);
  const int64_t d = shape.back();
  auto leaf = [&](const Shape& s, double std) {
    return randn(s, rng, DType::F64, std).to(dtype).set_requires_grad(true);
  };
  Tensor x = leaf(shape, 2.0), a = leaf(shape, 1.0), w = leaf({d}, 0.5), b = leaf({d}, 1.0);
  const Tensor r1 = randn(shape, rng, dtype), r2 = randn(shape, rng, dtype);
  RegionFn fn = [&](const std::vector<Tensor>& in) {
    if (fused) {
      AddNorm o = layer ? add_layernorm(in[0], in[1], w, b) : add_rmsnorm(in[0], in[1], w);
      return std::vector<Tensor>{o.sum, o.normed};
    }
    Tensor s = add(in[0], in[1]);
    return std::vector<Tensor>{s, layer ? layernorm(s, w, b) : rmsnorm(s, w)};
  };
  std::vector<Tensor> out;
  out = keeps ? recompute_region(fn, {x, a}, *keeps) : fn({x, a});
  const Tensor& s = out[0];
  const Tensor& y = out[1];
  Tensor loss;
  switch (uses) {
    case Uses::Both: loss = add(sum(mul(s, r1)), sum(mul(y, r2))); break;
    case Uses::NormedOnly: loss = sum(mul(y, r2)); break;
    case Uses::SumOnly: loss = sum(mul(s, r1)); break;
    case Uses::SumTwice:
      loss = add(add(sum(mul(s, r1)), sum(mul(y, r2))), sum(mul(s, r2)));
      break;
  }
  backward(loss);
  Outcome o{s.to_vector(), y.to_vector(), {}};
  std::vector<Tensor> params = {x, a, w};
  if (layer) params.push_back(b);
  for (const Tensor& p : params) {
    // A weight no gradient reached (the sum alone used, unfused) counts as zero: the fused op
    // gives its parameters zeros there.
    const std::vector<double> g = p.grad().defined() ? p.grad().to_vector()
                                                     : std::vector<double>(p.numel(), 0.0);
    o.grads.insert(o.grads.end(), g.begin(), g.end());
  }
  return o;
}

// got == want element for element (rtol 0), else within rtol of want's largest magnitude;
// reports the first element out of bounds, not the whole vectors.
void check_equal(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                 double rtol = 0.0) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  size_t first = 0;
  while (first < got.size() && std::abs(got[first] - want[first]) <= rtol * scale) ++first;
  INFO("first difference at element " << first << " of " << got.size() << ": "
                                      << (first < got.size() ? got[first] : 0.0) << " vs "
                                      << (first < got.size() ? want[first] : 0.0));
  CHECK(first == got.size());
}

}  // namespace

TEST_CASE("add_rmsnorm and add_layernorm equal add then the norm bit for bit, forward and backward",
          "[forward]") {
  const std::vector<Shape> shapes = {{3, 17}, {2, 130, 257}};  // the second past kParallelElements
  for (bool layer : {false, true})
    for (DType dtype : {DType::F32, DType::F64})
      for (const Shape& shape : shapes)
        for (Uses uses : {Uses::Both, Uses::NormedOnly, Uses::SumOnly, Uses::SumTwice}) {
          INFO((layer ? "layernorm " : "rmsnorm ") << dtype_name(dtype) << " "
                                                   << shape_str(shape) << " uses "
                                                   << static_cast<int>(uses));
          const Outcome want = run(false, layer, uses, dtype, shape);
          const Outcome got = run(true, layer, uses, dtype, shape);
          check_equal("sum", got.sum, want.sum);
          check_equal("normed", got.normed, want.normed);
          const double rtol = uses != Uses::SumTwice ? 0.0 : dtype == DType::F32 ? 1e-6 : 1e-14;
          check_equal("gradients", got.grads, want.grads, rtol);
        }
}

TEST_CASE("a fused add + norm in a recompute region gives the gradients it gives outside one",
          "[forward]") {
  for (bool layer : {false, true})
    for (RegionKeeps keeps : {RegionKeeps::InputsOnly, RegionKeeps::CostlyOpOutputs}) {
      INFO((layer ? "layernorm " : "rmsnorm ") << "keeps " << static_cast<int>(keeps));
      const Outcome want = run(false, layer, Uses::Both, DType::F32, {4, 33});
      const Outcome got = run(true, layer, Uses::Both, DType::F32, {4, 33}, keeps);
      check_equal("sum", got.sum, want.sum);
      check_equal("normed", got.normed, want.normed);
      check_equal("gradients", got.grads, want.grads);
    }
}

TEST_CASE("a fused add + norm runs its backward once and then refuses a second", "[forward]") {
  Rng rng(2);
  Tensor x = randn({2, 5}, rng).set_requires_grad(true);
  Tensor a = randn({2, 5}, rng);
  Tensor w = Tensor::full({5}, 1.0).set_requires_grad(true);
  const AddNorm o = add_rmsnorm(x, a, w);
  const Tensor loss = add(sum(o.sum), sum(o.normed));
  backward(loss);
  CHECK(x.grad().defined());
  CHECK_FALSE(a.grad().defined());  // a does not require grad
  CHECK(w.grad().defined());
  CHECK_THROWS_WITH(backward(loss), Contains("a second time"));
}

TEST_CASE("add_rmsnorm and add_layernorm reject bad arguments by name", "[errors]") {
  const Tensor x = Tensor::zeros({2, 4}), w = Tensor::full({4}, 1.0), b = Tensor::zeros({4});
  CHECK_THROWS_WITH(add_rmsnorm(x, Tensor::zeros({2, 3}), w),
                    Contains("add_rmsnorm") && Contains("a [2, 3]") && Contains("x's shape"));
  CHECK_THROWS_WITH(add_rmsnorm(x, Tensor::zeros({4}), w), Contains("add_rmsnorm"));
  CHECK_THROWS_WITH(add_rmsnorm(x, Tensor::zeros({2, 4}, DType::F64), w),
                    Contains("add_rmsnorm") && Contains("a"));
  CHECK_THROWS_WITH(add_layernorm(x, x, w, Tensor::zeros({3})),
                    Contains("add_layernorm") && Contains("bias"));
  CHECK_THROWS_WITH(add_layernorm(x, x, Tensor::full({5}, 1.0), b),
                    Contains("add_layernorm") && Contains("weight"));
}
