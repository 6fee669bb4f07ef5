// row_scores against cast then linear (x in a narrower dtype than w: f32 rows against an f64
// weight stand for bf16 against f32 on the CPU): the scores and both gradients bit for bit, on
// rows below and past the OpenMP threshold; the weight as a leaf (its gradient added in place
// over two passes) and through another op; x alone or w alone requiring grad; in a recompute
// region that keeps costly outputs; argument errors. Float64 gradients: grad_cases_basic.cpp.
#include <catch2/catch.hpp>
#include <optional>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "core/recompute.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {

struct Setup {
  DType x_dtype = DType::F32, w_dtype = DType::F64;
  Shape x = {2, 5, 24};
  bool leaf = true, x_grad = true, w_grad = true;
  int passes = 1;
  bool region = false;
};

struct Outcome {
  std::vector<double> r, grads;
};

Outcome run(bool fused, const Setup& s) {
  Rng rng(23);
  Tensor x = randn(s.x, rng, DType::F64, 1.5).to(s.x_dtype).set_requires_grad(s.x_grad);
  Tensor w = randn({1, s.x.back()}, rng, DType::F64, 0.3).to(s.w_dtype).set_requires_grad(s.w_grad);
  Shape rs = s.x;
  rs.back() = 1;
  const Tensor c = randn(rs, rng, s.w_dtype);
  Outcome o;
  for (int pass = 0; pass < s.passes; ++pass) {
    RegionFn fn = [&](const std::vector<Tensor>& in) {
      const Tensor wt = s.leaf ? w : scale(w, 1.0);
      return std::vector<Tensor>{fused ? row_scores(in[0], wt) : linear(cast(in[0], s.w_dtype), wt)};
    };
    const Tensor r =
        s.region ? recompute_region(fn, {x}, RegionKeeps::CostlyOpOutputs)[0] : fn({x})[0];
    CHECK(r.dtype() == s.w_dtype);
    backward(sum(mul(r, c)));
    o.r = r.to_vector();
  }
  for (const Tensor* p : {&x, &w})
    if (p->requires_grad()) {
      CHECK(p->grad().dtype() == p->dtype());
      const std::vector<double> g = p->grad().to_vector();
      o.grads.insert(o.grads.end(), g.begin(), g.end());
    }
  return o;
}

void check_same(const Setup& s) {
  const Outcome want = run(false, s), got = run(true, s);
  CHECK(got.r == want.r);
  CHECK(got.grads == want.grads);
}

}  // namespace

TEST_CASE("row_scores equals cast then linear bit for bit", "[ops][row_scores]") {
  for (const Shape& x : {Shape{2, 5, 24}, Shape{7, 3}, Shape{4, 300, 96}}) {
    INFO("x " << shape_str(x));
    Setup s;
    s.x = x;
    check_same(s);
    s.x_dtype = DType::F64;  // no narrowing: linear itself
    check_same(s);
  }
}

TEST_CASE("row_scores: leaf and non-leaf weights over two passes, one input requiring grad",
          "[ops][row_scores]") {
  for (bool leaf : {true, false}) {
    INFO((leaf ? "leaf w" : "w through scale()"));
    Setup s;
    s.leaf = leaf;
    s.passes = 2;
    check_same(s);
  }
  Setup only_x, only_w;
  only_x.w_grad = false;
  only_w.x_grad = false;
  check_same(only_x);
  check_same(only_w);
}

TEST_CASE("row_scores in a recompute region replays its kept scores", "[ops][row_scores][recompute]") {
  Setup plain, region;
  region.region = true;
  const Outcome want = run(false, plain), got = run(true, region);
  CHECK(got.r == want.r);
  CHECK(got.grads == want.grads);
}

TEST_CASE("row_scores names what it cannot take", "[ops][row_scores]") {
  const Tensor x = Tensor::zeros({3, 4}, DType::F32);
  CHECK_THROWS_WITH(row_scores(x, Tensor::zeros({2, 4}, DType::F64)),
                    Contains("row_scores") && Contains("w [2, 4]") && Contains("[1, D]"));
  CHECK_THROWS_WITH(row_scores(x, Tensor::zeros({1, 5}, DType::F64)), Contains("x [3, 4]"));
  CHECK_THROWS_WITH(row_scores(Tensor::zeros({3, 4}, DType::F64), Tensor::zeros({1, 4}, DType::F32)),
                    Contains("wider than w's f32"));
}
