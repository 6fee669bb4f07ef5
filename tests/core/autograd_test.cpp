// The autograd engine: accumulation through shared inputs, leaf accumulation across calls,
// no-grad scopes, and the errors for misuse.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "core/all_ops.h"
#include "core/cpu/op_trace.h"
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

namespace {
// Random f64 [r, c] entries in [-1, 1).
Tensor random_matrix(int64_t r, int64_t c, uint64_t seed) {
  Rng rng(seed);
  std::vector<double> v(static_cast<size_t>(r * c));
  for (double& e : v) e = 2.0 * rng.uniform() - 1.0;
  return Tensor::from_vector(v, {r, c}, DType::F64);
}

// sum over rows of g^T x: the weight gradient of y = x w^T for dy = g, by loops.
std::vector<double> weight_grad(const Tensor& g, const Tensor& x) {
  const int64_t n = g.size(0), out = g.size(1), in = x.size(1);
  const std::vector<double> gv = g.to_vector(), xv = x.to_vector();
  std::vector<double> dw(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t j = 0; j < in; ++j) dw[o * in + j] += gv[i * out + o] * xv[i * in + j];
  return dw;
}

int count_named(const std::vector<DeviceActivity>& trace, const std::string& prefix) {
  int n = 0;
  for (const DeviceActivity& a : trace) n += a.name.rfind(prefix, 0) == 0;
  return n;
}

// The CPU ops a backward from out with seed runs.
std::vector<DeviceActivity> traced_backward(Tensor out, const Tensor& seed) {
  cpu::start_op_trace();
  out.backward(seed);
  return cpu::stop_op_trace();
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12));
}
}  // namespace

// Gradient-accumulation fusion: once a weight holds a gradient, a linear layer's backward adds
// dW into it with the GEMM (beta = 1): no separate dW, no axpy, the same buffer, the exact sum.
TEST_CASE("a weight's gradient accumulates inside its GEMM once it exists", "[autograd]") {
  Tensor w = random_matrix(5, 6, 1).set_requires_grad(true);
  const Tensor x1 = random_matrix(4, 6, 2), x2 = random_matrix(3, 6, 3), x3 = random_matrix(2, 6, 4);
  const Tensor g1 = random_matrix(4, 5, 5), g2 = random_matrix(3, 5, 6), g3 = random_matrix(2, 5, 7);

  linear(x1, w).backward(g1);  // the first micro-batch: a fresh gradient, kept as is
  const void* buffer = w.grad().raw_data();
  const std::vector<DeviceActivity> trace = traced_backward(linear(x2, w), g2);
  CHECK(count_named(trace, "gemm TN 5x6x3") == 1);
  CHECK(count_named(trace, "axpy") == 0);
  CHECK(w.grad().raw_data() == buffer);

  // The same weight twice in one graph (a tied embedding), both products adding in place.
  Tensor tied = add(sum(mul(linear(x2, w), g2)), sum(mul(linear(x3, w), g3)));
  tied.backward();

  std::vector<double> want = weight_grad(g1, x1);
  for (const auto& [g, x] : {std::pair{g2, x2}, {g2, x2}, {g3, x3}}) {
    const std::vector<double> dw = weight_grad(g, x);
    for (size_t i = 0; i < want.size(); ++i) want[i] += dw[i];
  }
  check_close(w.grad().to_vector(), want);

  // A weight that is not a leaf (here a scaled copy) takes the ordinary path.
  Tensor v = random_matrix(5, 6, 8).set_requires_grad(true);
  linear(x1, scale(v, 2.0)).backward(g1);
  linear(x1, scale(v, 2.0)).backward(g1);
  std::vector<double> dv = weight_grad(g1, x1);
  for (double& e : dv) e *= 4.0;
  check_close(v.grad().to_vector(), dv);
}

// The same for an embedding table: the second micro-batch's scatter adds into the gradient
// the first left, with no zeroed table and no axpy.
TEST_CASE("an embedding table's gradient accumulates inside its scatter once it exists",
          "[autograd]") {
  Tensor table = random_matrix(7, 3, 11).set_requires_grad(true);
  const Tensor ids1 = Tensor::from_indices({2, 5, 2}, {3}), ids2 = Tensor::from_indices({5, 0}, {2});
  const Tensor g1 = random_matrix(3, 3, 12), g2 = random_matrix(2, 3, 13);
  embedding(ids1, table).backward(g1);
  const void* buffer = table.grad().raw_data();
  const std::vector<DeviceActivity> trace = traced_backward(embedding(ids2, table), g2);
  CHECK(count_named(trace, "embedding_backward") == 1);
  CHECK(count_named(trace, "axpy") == 0);
  CHECK(count_named(trace, "fill") == 0);
  CHECK(table.grad().raw_data() == buffer);

  std::vector<double> want(7 * 3, 0.0);
  for (const auto& [ids, g] : {std::pair{ids1, g1}, {ids2, g2}}) {
    const std::vector<double> gv = g.to_vector();
    for (int64_t i = 0; i < ids.numel(); ++i)
      for (int64_t j = 0; j < 3; ++j)
        want[static_cast<int64_t>(ids.at(i)) * 3 + j] += gv[i * 3 + j];
  }
  check_close(table.grad().to_vector(), want);
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

// accumulating_input_grad: MoD's gather of C rows adds its rows into the gradient the engine
// already holds for the gathered tensor (an intermediate), instead of a zero-filled full-size
// gradient and the engine's sum of the two (an axpy); when its gradient is the first to arrive
// it takes the ordinary path. Either way the sum is exact. (A held gradient that is shared is
// declined by the sole-owner check accumulate() uses, tested above.)
TEST_CASE("gather_rows adds its rows into an intermediate's gradient in place once one exists",
          "[autograd]") {
  const Tensor idx = Tensor::from_indices({1, 3, 0, 4}, {2, 2});
  const Tensor c1 = random_matrix(10, 3, 21).view({2, 5, 3}),
               c2 = random_matrix(4, 3, 22).view({2, 2, 3});
  // d/dx of sum(x * c1) + sum(gather(x) * c2) = c1 + the rows of c2 at idx.
  std::vector<double> want = c1.to_vector();
  const std::vector<double> c2v = c2.to_vector();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t j = 0; j < 3; ++j)
        want[(b * 5 + static_cast<int64_t>(idx.at(b * 2 + c))) * 3 + j] += c2v[(b * 2 + c) * 3 + j];
  for (bool gather_second : {true, false}) {
    INFO((gather_second ? "the gather's gradient arrives second (in place)"
                        : "the gather's gradient arrives first"));
    Tensor leaf = random_matrix(10, 3, 20).view({2, 5, 3}).set_requires_grad(true);
    const Tensor x = scale(leaf, 1.0);
    const Tensor g = sum(mul(gather_rows(x, idx), c2)), m = sum(mul(x, c1));
    // The engine runs a root's first input's nodes last: the other path's gradient comes first.
    const std::vector<DeviceActivity> trace =
        traced_backward(gather_second ? add(g, m) : add(m, g), Tensor::scalar(1.0, DType::F64));
    CHECK(count_named(trace, "axpy") == (gather_second ? 0 : 1));
    check_close(leaf.grad().to_vector(), want);
  }
}

// The same for a GEMM's input: an activation feeding three linear layers (a block's normed input
// feeding q, k and v) gets the second and third dA added by their GEMMs (beta = 1) into the
// gradient the first left: no separate dA, no axpy.
TEST_CASE("an activation feeding several GEMMs has their input gradients added by the GEMMs",
          "[autograd]") {
  Tensor leaf = random_matrix(4, 6, 31).set_requires_grad(true);
  const Tensor h = scale(leaf, 1.0);
  const Tensor w1 = random_matrix(5, 6, 32), w2 = random_matrix(3, 6, 33), w3 = random_matrix(2, 6, 34);
  const Tensor g1 = random_matrix(4, 5, 35), g2 = random_matrix(4, 3, 36), g3 = random_matrix(4, 2, 37);
  const Tensor loss = add(add(sum(mul(linear(h, w1), g1)), sum(mul(linear(h, w2), g2))),
                          sum(mul(linear(h, w3), g3)));
  const std::vector<DeviceActivity> trace = traced_backward(loss, Tensor::scalar(1.0, DType::F64));
  CHECK(count_named(trace, "axpy") == 0);
  // dh = g1 w1 + g2 w2 + g3 w3, by loops.
  std::vector<double> want(4 * 6, 0.0);
  for (const auto& [g, w] : {std::pair{g1, w1}, {g2, w2}, {g3, w3}}) {
    const std::vector<double> gv = g.to_vector(), wv = w.to_vector();
    const int64_t out = w.size(0);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t j = 0; j < 6; ++j) want[i * 6 + j] += gv[i * out + o] * wv[o * 6 + j];
  }
  check_close(leaf.grad().to_vector(), want);
}
