// The autograd engine: accumulation through shared inputs, leaf accumulation across calls,
// no-grad scopes, and the errors for misuse.
#include <catch2/catch.hpp>

#include "core/all_ops.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

TEST_CASE("a tensor feeding several ops accumulates every path's gradient", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, -2.0, 3.0}, {3}, DType::F64).set_requires_grad(true);
  // y = sum(x*x + 3x + x) -> dy/dx = 2x + 4
  Tensor y = sum(add(add(mul(x, x), scale(x, 3.0)), x));
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{6.0, 0.0, 10.0});
}

TEST_CASE("a diamond graph sums both branches into the shared node", "[autograd]") {
  Tensor x = Tensor::from_vector({0.5, 2.0}, {2}, DType::F64).set_requires_grad(true);
  Tensor h = scale(x, 2.0);              // shared intermediate
  Tensor y = sum(mul(h, h));             // d/dx = 2h * 2 = 8x
  Tensor z = add(y, sum(scale(h, 5.0)));  // + 10
  z.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{14.0, 26.0});
}

// Sums into an intermediate's gradient happen in place only when the engine holds that gradient
// alone: add hands one tensor to both its inputs, so adding h1's second path into it in place
// would change h2's too (both wait for a second path here).
TEST_CASE("summing an intermediate's gradients never writes into a shared one", "[autograd]") {
  for (const bool shared_first : {true, false}) {  // the order the engine meets the paths in
    Tensor x = Tensor::from_vector({1.0, -1.0}, {2}, DType::F64).set_requires_grad(true);
    Tensor h1 = scale(x, 2.0), h2 = scale(x, 3.0);
    const Tensor shared = sum(add(h1, h2));
    const Tensor own = add(sum(scale(h1, 5.0)), sum(scale(h2, 7.0)));
    // dy/dh1 = 1 + 5, dy/dh2 = 1 + 7, dy/dx = 2 * 6 + 3 * 8
    Tensor y = shared_first ? add(shared, own) : add(own, shared);
    y.backward();
    INFO("shared first " << shared_first);
    CHECK(x.grad().to_vector() == std::vector<double>{36.0, 36.0});
  }
}

TEST_CASE("leaf gradients accumulate across backward calls until zero_grad", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::F64).set_requires_grad(true);
  sum(scale(x, 3.0)).backward();
  sum(scale(x, 3.0)).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{6.0, 6.0});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

// A fresh gradient becomes the leaf's gradient without a copy only when nothing else holds it:
// add's backward hands the same tensor to both inputs, so each leaf must get its own.
TEST_CASE("leaf gradients never share storage with each other or with the graph", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::F64).set_requires_grad(true);
  Tensor y = Tensor::from_vector({3.0, 4.0}, {2}, DType::F64).set_requires_grad(true);
  sum(add(x, y)).backward();
  REQUIRE(x.grad().raw_data() != y.grad().raw_data());
  sum(scale(x, 2.0)).backward();  // accumulates into x's gradient alone
  CHECK(x.grad().to_vector() == std::vector<double>{3.0, 3.0});
  CHECK(y.grad().to_vector() == std::vector<double>{1.0, 1.0});

  // A matmul's weight gradient is its own fresh buffer: kept as is, and still exact.
  Tensor a = Tensor::from_vector({1.0, 2.0, 3.0, 4.0}, {2, 2}, DType::F64);
  Tensor w = Tensor::from_vector({1.0, 0.0, 0.0, 1.0}, {2, 2}, DType::F64).set_requires_grad(true);
  sum(matmul(a, w)).backward();
  CHECK(w.grad().sole_owner());
  CHECK(w.grad().to_vector() == std::vector<double>{4.0, 4.0, 6.0, 6.0});
}

TEST_CASE("the no-grad scope records nothing", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}).set_requires_grad(true);
  {
    NoGradGuard guard;
    Tensor y = mul(x, x);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    CHECK_THROWS_WITH(sum(y).backward(), Contains("does not require grad"));
  }
  CHECK(grad_enabled());
  CHECK(mul(x, x).grad_fn() != nullptr);
}

TEST_CASE("backward twice through the same graph is a clear error", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}).set_requires_grad(true);
  Tensor y = sum(mul(x, x));
  y.backward();
  CHECK_THROWS_WITH(y.backward(), Contains("second time") && Contains("sum"));
}

TEST_CASE("backward on a non-scalar needs a seed of its shape", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0, 3.0}, {3}).set_requires_grad(true);
  Tensor y = scale(x, 2.0);
  CHECK_THROWS_WITH(y.backward(), Contains("not a scalar") && Contains("[3]"));
  CHECK_THROWS_WITH(y.backward(Tensor::zeros({2})), Contains("seed"));
  y.backward(Tensor::from_vector({1.0, 0.0, -1.0}, {3}));
  CHECK(x.grad().to_vector() == std::vector<double>{2.0, 0.0, -2.0});
}

TEST_CASE("saved outputs do not keep the graph alive (no reference cycles)", "[autograd]") {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}).set_requires_grad(true);
  std::weak_ptr<Node> node;
  {
    Tensor y = mul(x, x);
    node = y.grad_fn();
    CHECK_FALSE(node.expired());
  }
  CHECK(node.expired());
}

TEST_CASE("tensor storage is 64-byte aligned and views share it", "[tensor]") {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::zeros({n}, DType::F32);
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % 64 == 0);
  }
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v = a.view({3, 2});
  v.set(5, 42.0);
  CHECK(a.at(5) == 42.0);
  CHECK(a.to(DType::F64).dtype() == DType::F64);
  CHECK(a.to(DType::F64).at(5) == 42.0);
  CHECK_THROWS_WITH(a.view({4, 2}), Contains("[2, 3]") && Contains("[4, 2]"));
}
