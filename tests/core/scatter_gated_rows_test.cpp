// scatter_gated_rows against scatter_add_rows(x, idx, mul(src, gate)): the output and every
// gradient bit for bit, in f64 and f32, with distinct and repeated indices, a gate made by
// another op (MoD's sigmoid of gathered scores) or a leaf, each input alone requiring grad, and
// over two passes (gradients accumulating); argument errors. Float64 gradients:
// grad_cases_routing_loss.cpp.
#include <catch2/catch.hpp>
#include <vector>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {

struct Setup {
  DType dtype = DType::F32;
  int64_t b = 2, t = 9, d = 12;
  std::vector<int64_t> idx = {0, 3, 4, 8, 1, 2, 5, 7};  // [B,C] = [2,4]
  bool x_grad = true, src_grad = true, gate_grad = true;
  bool gate_from_op = true;  // sigmoid of gathered scores, as a routed block makes it
  int passes = 1;
};

struct Outcome {
  std::vector<double> out, grads;
};

Outcome run(bool fused, const Setup& s) {
  Rng rng(31);
  const int64_t c = static_cast<int64_t>(s.idx.size()) / s.b;
  const Tensor idx = Tensor::from_indices(s.idx, {s.b, c});
  Tensor x = randn({s.b, s.t, s.d}, rng, DType::F64).to(s.dtype).set_requires_grad(s.x_grad);
  Tensor src = randn({s.b, c, s.d}, rng, DType::F64).to(s.dtype).set_requires_grad(s.src_grad);
  Tensor scores = randn({s.b, s.t, 1}, rng, DType::F64).to(s.dtype).set_requires_grad(s.gate_grad);
  Tensor leaf_gate = randn({s.b, c, 1}, rng, DType::F64).to(s.dtype).set_requires_grad(s.gate_grad);
  const Tensor weights = randn({s.b, s.t, s.d}, rng, DType::F64).to(s.dtype);
  Outcome o;
  for (int pass = 0; pass < s.passes; ++pass) {
    const Tensor gate = s.gate_from_op ? sigmoid(gather_rows(scores, idx)) : leaf_gate;
    const Tensor out = fused ? scatter_gated_rows(x, idx, src, gate)
                             : scatter_add_rows(x, idx, mul(src, gate));
    if (s.x_grad || s.src_grad || s.gate_grad) backward(sum(mul(out, weights)));
    o.out = out.to_vector();
  }
  for (const Tensor* p : {&x, &src, s.gate_from_op ? &scores : &leaf_gate})
    if (p->requires_grad()) {
      CHECK(p->grad().dtype() == s.dtype);
      const std::vector<double> g = p->grad().to_vector();
      o.grads.insert(o.grads.end(), g.begin(), g.end());
    }
  return o;
}

void check_same(const Setup& s) {
  const Outcome want = run(false, s), got = run(true, s);
  CHECK(got.out == want.out);
  CHECK(got.grads == want.grads);
}

}  // namespace

TEST_CASE("scatter_gated_rows equals mul then scatter_add_rows bit for bit", "[ops][routing]") {
  for (DType dtype : {DType::F64, DType::F32}) {  // the CPU's float dtypes
    INFO(dtype_name(dtype));
    Setup s;
    s.dtype = dtype;
    check_same(s);
    s.gate_from_op = false;
    check_same(s);
    s.d = 1;  // one column: mul's broadcast is then the same shape
    check_same(s);
  }
}

TEST_CASE("scatter_gated_rows: repeated indices, each input alone, two passes",
          "[ops][routing]") {
  Setup s;
  s.idx = {2, 2, 7, 0, 5, 5, 5, 1};  // repeats add in order, as scatter_add_rows' do
  check_same(s);
  for (int which = 0; which < 3; ++which) {
    INFO("only input " << which << " requires grad");
    Setup one;
    one.x_grad = which == 0;
    one.src_grad = which == 1;
    one.gate_grad = which == 2;
    check_same(one);
  }
  Setup twice;
  twice.passes = 2;
  twice.gate_from_op = false;
  check_same(twice);
}

TEST_CASE("scatter_gated_rows records one node and no mul", "[ops][routing]") {
  Rng rng(5);
  const Tensor x = randn({1, 4, 3}, rng).set_requires_grad(true);
  const Tensor src = randn({1, 2, 3}, rng).set_requires_grad(true);
  const Tensor gate = randn({1, 2, 1}, rng).set_requires_grad(true);
  const Tensor out = scatter_gated_rows(x, Tensor::from_indices({1, 3}, {1, 2}), src, gate);
  REQUIRE(out.grad_fn());
  CHECK(out.grad_fn()->op == Op::ScatterGatedRows);
  CHECK(x.to_vector() != out.to_vector());
}

TEST_CASE("scatter_gated_rows errors name the argument and the shape expected",
          "[ops][routing][errors]") {
  Rng rng(6);
  const Tensor x = randn({2, 5, 3}, rng), src = randn({2, 2, 3}, rng);
  const Tensor idx = Tensor::from_indices({0, 1, 2, 3}, {2, 2});
  CHECK_THROWS_WITH(scatter_gated_rows(x, idx, src, randn({2, 2}, rng)),
                    Contains("gate [2, 2]") && Contains("[B,C,1] = [2, 2, 1]"));
  CHECK_THROWS_WITH(scatter_gated_rows(x, idx, randn({2, 3, 3}, rng), randn({2, 2, 1}, rng)),
                    Contains("src [2, 3, 3]"));
  CHECK_THROWS_WITH(scatter_gated_rows(x, idx, src, randn({2, 2, 1}, rng, DType::F64)),
                    Contains("gate"));
  CHECK_THROWS_WITH(scatter_gated_rows(x, Tensor::from_indices({0, 1, 2, 5}, {2, 2}), src,
                                       randn({2, 2, 1}, rng)),
                    Contains("idx"));
}
