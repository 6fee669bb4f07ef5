// Forward of embedding, the MoD routing primitives (top-k, gather, scatter-add), the BCE routing
// loss, the fused LM head + cross-entropy (against the unfused ops) and AdamW against naive
// references written here, plus their argument errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/optim.h"
#include "core/random.h"
#include "core/weight_copy.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
void check_close(const Tensor& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i) {
    INFO("element " << i);
    CHECK(got.at(i) == Approx(want[static_cast<size_t>(i)]).margin(tol).epsilon(tol));
  }
}

// Exact equality, reported only at the first mismatch so a broken kernel prints one line.
void check_equal(const Tensor& got, const std::vector<double>& want) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  int64_t bad = -1;
  for (int64_t i = 0; i < got.numel() && bad < 0; ++i)
    if (got.at(i) != want[static_cast<size_t>(i)]) bad = i;
  INFO("first mismatch at " << bad);
  CHECK(bad == -1);
}

std::vector<int64_t> random_indices(int64_t n, int64_t limit, Rng& rng) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.below(limit);
  return v;
}

// Top-k of one row by a full sort under (score desc, position asc), then ascending positions.
std::vector<int64_t> naive_topk(const std::vector<double>& row, int64_t k) {
  std::vector<int64_t> pos(row.size());
  std::iota(pos.begin(), pos.end(), int64_t{0});
  std::stable_sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
  pos.resize(static_cast<size_t>(k));
  std::sort(pos.begin(), pos.end());
  return pos;
}

std::vector<int64_t> row_of(const Tensor& idx, int64_t r) {
  const int64_t k = idx.size(1);
  std::vector<int64_t> out(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<int64_t>(idx.at(r * k + j));
  return out;
}
}  // namespace

TEST_CASE("embedding forward copies table rows, also past the parallel threshold", "[forward]") {
  Rng rng(11);
  for (auto [n, vocab, d, dt] : {std::tuple{10, 7, 13, DType::I64}, {6000, 300, 33, DType::I32}}) {
    DYNAMIC_SECTION("N=" << n << " V=" << vocab << " D=" << d) {
      Tensor table = randn({vocab, d}, rng);
      std::vector<int64_t> ids = random_indices(n, vocab, rng);
      Tensor out = embedding(Tensor::from_indices(ids, {2, n / 2}, dt), table);
      CHECK(out.shape() == Shape{2, n / 2, d});
      std::vector<double> want(static_cast<size_t>(n * d));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < d; ++j) want[i * d + j] = table.at(ids[i] * d + j);
      check_equal(out, want);
    }
  }
}

TEST_CASE("embedding backward accumulates repeated ids, also in parallel", "[forward]") {
  Rng rng(12);
  const int64_t n = 3000, vocab = 50, d = 40;  // 120000 gradient elements: the parallel path
  Tensor table = randn({vocab, d}, rng).set_requires_grad(true);
  std::vector<int64_t> ids = random_indices(n, vocab, rng);
  Tensor seed = randn({n, d}, rng);
  embedding(Tensor::from_indices(ids, {n}), table).backward(seed);
  std::vector<double> want(static_cast<size_t>(vocab * d), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) want[ids[i] * d + j] += seed.at(i * d + j);
  check_close(table.grad(), want, 1e-4);
}

TEST_CASE("gather_rows and scatter_add_rows match naive references", "[forward]") {
  Rng rng(13);
  // The 2nd and 4th shapes cross the parallel threshold; B=1 splits D into column tiles.
  for (auto [b, t, c, d] :
       {std::tuple{2, 9, 5, 13}, {8, 700, 512, 40}, {3, 64, 200, 33}, {1, 300, 1000, 100}}) {
    DYNAMIC_SECTION("B=" << b << " T=" << t << " C=" << c << " D=" << d) {
      Tensor x = randn({b, t, d}, rng), src = randn({b, c, d}, rng);
      std::vector<int64_t> idx = random_indices(b * c, t, rng);  // repeats and any order
      Tensor idx_t = Tensor::from_indices(idx, {b, c});
      const std::vector<double> x_before = x.to_vector();
      std::vector<double> want_g(static_cast<size_t>(b * c * d));
      std::vector<double> want_s = x.to_vector();
      for (int64_t bi = 0; bi < b; ++bi)
        for (int64_t ci = 0; ci < c; ++ci) {
          const int64_t row = bi * t + idx[bi * c + ci];
          for (int64_t j = 0; j < d; ++j) {
            want_g[(bi * c + ci) * d + j] = x.at(row * d + j);
            want_s[row * d + j] += src.at((bi * c + ci) * d + j);
          }
        }
      Tensor g = gather_rows(x, idx_t);
      CHECK(g.shape() == Shape{b, c, d});
      check_equal(g, want_g);
      Tensor s = scatter_add_rows(x, idx_t, src);
      CHECK(s.shape() == x.shape());
      check_close(s, want_s, 1e-5);
      CHECK(x.to_vector() == x_before);  // out-of-place: x itself is untouched
    }
  }
}

// An MoE's slots: 4 experts of 6 slots each, distinct tokens within an expert, repeats across.
// Run by run is the order the CPU's one pass adds in already, so the results are bitwise equal
// (on a GPU, where one pass adds repeats in any order, runs make it this order).
TEST_CASE("gather_rows and scatter_add_rows in runs equal one pass, forward and backward",
          "[forward]") {
  Rng rng(15);
  const int64_t runs = 4, len = 6, t = 10, d = 7;
  std::vector<int64_t> idx;
  for (int64_t r = 0; r < runs; ++r)
    for (int64_t j = 0; j < len; ++j) idx.push_back((j * 3 + r) % t);  // distinct within a run
  const Tensor idx_t = Tensor::from_indices(idx, {1, runs * len});
  const Tensor x0 = randn({1, t, d}, rng), src0 = randn({1, runs * len, d}, rng);
  const Tensor seed = randn({1, t, d}, rng);
  std::vector<double> out[2], dx[2], dsrc[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t r = k == 0 ? 1 : runs;
    Tensor x = x0.clone().set_requires_grad(true), src = src0.clone().set_requires_grad(true);
    // gather's backward is a scatter with repeats; scatter's forward is one too
    Tensor y = scatter_add_rows(x, idx_t, mul(gather_rows(x, idx_t, r), src), r);
    y.backward(seed);
    out[k] = y.to_vector();
    dx[k] = x.grad().to_vector();
    dsrc[k] = src.grad().to_vector();
  }
  CHECK(out[1] == out[0]);
  CHECK(dx[1] == dx[0]);
  CHECK(dsrc[1] == dsrc[0]);
  // runs must split C evenly, with one batch row
  CHECK_THROWS_WITH(gather_rows(x0, idx_t, 5), Contains("gather_rows") && Contains("runs = 5"));
  CHECK_THROWS_WITH(scatter_add_rows(randn({2, t, d}, rng), Tensor::from_indices(idx, {2, 12}),
                                     randn({2, 12, d}, rng), 2),
                    Contains("scatter_add_rows") && Contains("B must be 1"));
}

TEST_CASE("bce_with_logits matches a naive mean, also at extreme logits", "[forward]") {
  Rng rng(14);
  for (int64_t n : {int64_t{17}, int64_t{40000}}) {
    Tensor x = randn({n}, rng, DType::F32, 4.0), t = rand_uniform({n}, rng);
    x.set(0, 120.0);  // exp(120) overflows f32: the stable form must not
    x.set(1, -120.0);
    double want = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = x.at(i), ti = t.at(i);
      want += std::max(xi, 0.0) - xi * ti + std::log1p(std::exp(-std::abs(xi)));
    }
    want /= static_cast<double>(n);
    Tensor loss = bce_with_logits(x, t);
    CHECK(loss.dim() == 0);
    CHECK(loss.item() == Approx(want).epsilon(1e-5));

    Tensor xg = x.clone().set_requires_grad(true);
    bce_with_logits(xg, t).backward();
    std::vector<double> want_dx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      want_dx[i] = (1.0 / (1.0 + std::exp(-x.at(i))) - t.at(i)) / static_cast<double>(n);
    check_close(xg.grad(), want_dx, 1e-6);
  }
}

TEST_CASE("topk_rows selects exactly k per row, ascending, ties to the lower position",
          "[forward]") {
  SECTION("all-equal scores give 0..k-1") {
    Tensor idx = topk_rows(Tensor::full({3, 10}, 0.5), 4);
    CHECK(idx.dtype() == DType::I64);
    CHECK(idx.shape() == Shape{3, 4});
    for (int64_t r = 0; r < 3; ++r) CHECK(row_of(idx, r) == std::vector<int64_t>{0, 1, 2, 3});
  }
  SECTION("explicit ties at the cut") {
    // The 3 largest: 9 at 4, then 5 at positions 1, 3, 6: positions 1 and 3 win the tie.
    Tensor s = Tensor::from_vector({1, 5, 0, 5, 9, 2, 5, 4}, {1, 8});
    CHECK(row_of(topk_rows(s, 3), 0) == std::vector<int64_t>{1, 3, 4});
    CHECK(row_of(topk_rows(s, 1), 0) == std::vector<int64_t>{4});
    CHECK(row_of(topk_rows(s, 8), 0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    Tensor neg = Tensor::from_vector({-1, -3, -1, -2, -1}, {1, 5}, DType::F64);
    CHECK(row_of(topk_rows(neg, 2), 0) == std::vector<int64_t>{0, 2});
  }
  SECTION("rows are independent: never a top-k across the batch") {
    // Row 0 has all the large scores; row 1 must still select its own k.
    Tensor s = Tensor::from_vector({10, 11, 12, 13, 14, 0, 0.3, 0.1, 0.2, 0}, {2, 5});
    Tensor idx = topk_rows(s, 2);
    CHECK(row_of(idx, 0) == std::vector<int64_t>{3, 4});
    CHECK(row_of(idx, 1) == std::vector<int64_t>{1, 3});
    Tensor alone = topk_rows(Tensor::from_vector({0, 0.3, 0.1, 0.2, 0}, {1, 5}), 2);
    CHECK(row_of(alone, 0) == row_of(idx, 1));
  }
  SECTION("NaN ranks below every number, NaNs tied by position (the GPU's order)") {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = 1.0 / 0.0;
    for (DType d : {DType::F32, DType::F64}) {
      Tensor s = Tensor::from_vector({nan, 2, nan, -inf, 7, nan}, {1, 6}, d);
      CHECK(row_of(topk_rows(s, 2), 0) == std::vector<int64_t>{1, 4});
      CHECK(row_of(topk_rows(s, 4), 0) == std::vector<int64_t>{0, 1, 3, 4});  // -inf, then NaN
      CHECK(row_of(topk_rows(s, 5), 0) == std::vector<int64_t>{0, 1, 2, 3, 4});
      Tensor all_nan = Tensor::full({2, 5}, nan, d);
      CHECK(row_of(topk_rows(all_nan, 3), 1) == std::vector<int64_t>{0, 1, 2});
    }
  }
  SECTION("forward only: no history") {
    Tensor s = Tensor::from_vector({1, 2, 3}, {1, 3}).set_requires_grad(true);
    Tensor idx = topk_rows(s, 2);
    CHECK_FALSE(idx.requires_grad());
    CHECK(idx.grad_fn() == nullptr);
  }
}

TEST_CASE("topk_rows on B=8, T=4096 matches a full sort", "[forward]") {
  Rng rng(15);
  const int64_t b = 8, t = 4096;
  Tensor s = randn({b, t}, rng);
  for (int64_t i = 0; i < b * t; i += 7) s.set(i, 0.25);  // plenty of ties
  for (int64_t k : {int64_t{1}, int64_t{512}, int64_t{2048}, int64_t{4095}}) {
    Tensor idx = topk_rows(s, k);
    REQUIRE(idx.shape() == Shape{b, k});
    for (int64_t r = 0; r < b; ++r) {
      std::vector<double> row(static_cast<size_t>(t));
      for (int64_t i = 0; i < t; ++i) row[i] = s.at(r * t + i);
      INFO("k " << k << " row " << r);
      CHECK(row_of(idx, r) == naive_topk(row, k));
    }
  }
}

TEST_CASE("adamw_update matches a naive double reference over 3 steps", "[forward]") {
  Rng rng(16);
  for (int64_t n : {int64_t{37}, int64_t{50000}}) {
    Tensor p = randn({n}, rng), m = Tensor::zeros({n}), v = Tensor::zeros({n});
    std::vector<double> rp = p.to_vector(), rm(static_cast<size_t>(n)), rv(static_cast<size_t>(n));
    AdamWArgs a;
    a.lr = 1e-2;
    a.beta1 = 0.9;
    a.beta2 = 0.95;
    a.eps = 1e-8;
    a.weight_decay = 0.1;
    for (int64_t step = 1; step <= 3; ++step) {
      Tensor g = randn({n}, rng);
      a.step = step;
      adamw_update(p, g, m, v, a);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g.at(i);
        rp[i] -= a.lr * a.weight_decay * rp[i];
        rm[i] = a.beta1 * rm[i] + (1 - a.beta1) * gi;
        rv[i] = a.beta2 * rv[i] + (1 - a.beta2) * gi * gi;
        const double mhat = rm[i] / (1 - std::pow(a.beta1, step));
        const double vhat = rv[i] / (1 - std::pow(a.beta2, step));
        rp[i] -= a.lr * mhat / (std::sqrt(vhat) + a.eps);
      }
    }
    check_close(p, rp, 1e-5);
    check_close(m, rm, 1e-5);
    check_close(v, rv, 1e-5);
  }
}

// What a captured step reads from device tensors instead of host arguments.
TEST_CASE("adamw_update with AdamWStepConstants equals the host-argument update", "[forward]") {
  Rng rng(17);
  AdamWArgs hyper;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.95;
  hyper.eps = 1e-8;
  hyper.weight_decay = 0.1;
  AdamWStepConstants consts(hyper, Device::CPU);
  for (bool decays : {true, false}) {
    Tensor p = randn({40}, rng), m = Tensor::zeros({40}), v = Tensor::zeros({40});
    Tensor q = p.clone(), mq = m.clone(), vq = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      const Tensor g = randn({40}, rng);
      consts.set(1e-2 * static_cast<double>(step), step);
      adamw_update(p, g, m, v, consts.args(decays), consts.tensor(decays));
      AdamWArgs a = hyper;
      a.lr = 1e-2 * static_cast<double>(step);
      a.step = step;
      a.weight_decay = decays ? hyper.weight_decay : 0.0;
      adamw_update(q, g, mq, vq, a);
    }
    INFO("decays " << decays);
    CHECK(p.to_vector() == q.to_vector());
    CHECK(m.to_vector() == mq.to_vector());
  }
  const auto c = adamw_step_constants(consts.args(true));
  CHECK(c[0] == 1.0 - 0.03 * 0.1);
  CHECK(c[1] == Approx(0.03 / (1 - std::pow(0.9, 3))));
  CHECK(c[2] == Approx(1 / std::sqrt(1 - std::pow(0.95, 3))));
  Tensor p = randn({4}, rng), m = Tensor::zeros({4}), v = Tensor::zeros({4});
  CHECK_THROWS_WITH(adamw_update(p, randn({4}, rng), m, v, consts.args(true), Tensor::zeros({3})),
                    Contains("consts") && Contains("f64 [3]"));
}

// The global-norm clip inside the update: grad_scale multiplies each gradient entry as it is
// read, giving the bits of a clipping pass over the gradient followed by the update; the scale
// must be one element of the gradient's dtype and device.
TEST_CASE("adamw_update with grad_scale equals the update on a clipped gradient, bitwise",
          "[forward]") {
  Rng rng(18);
  for (const DType dtype : {DType::F32, DType::F64}) {
    INFO(dtype_name(dtype));
    AdamWArgs a;
    a.lr = 1e-2;
    a.weight_decay = 0.1;
    Tensor p = randn({50000}, rng, dtype), m = Tensor::zeros({50000}, dtype),
           v = Tensor::zeros({50000}, dtype);
    Tensor q = p.clone(), mq = m.clone(), vq = v.clone();
    for (int64_t step = 1; step <= 3; ++step) {
      a.step = step;
      const Tensor g = randn({50000}, rng, dtype);
      const double f = 0.3 + 0.2 * static_cast<double>(step);
      const Tensor factor = Tensor::full({}, f, dtype);
      adamw_update(p, g, m, v, a, [&] {
        const auto c = adamw_step_constants(a);
        return Tensor::from_vector({c.begin(), c.end()}, {kAdamWConstants}, DType::F64);
      }(), factor);
      Tensor clipped = Tensor::empty(g.shape(), dtype);  // the clipping pass it replaces
      backend(Device::CPU).binary(BinaryKind::Mul, Broadcast::Outer, 1, g.numel(), g, factor,
                                  clipped);
      adamw_update(q, clipped, mq, vq, a);
    }
    CHECK(p.to_vector() == q.to_vector());
    CHECK(m.to_vector() == mq.to_vector());
    CHECK(v.to_vector() == vq.to_vector());
  }
  Tensor p = randn({4}, rng), m = Tensor::zeros({4}), v = Tensor::zeros({4});
  AdamWArgs a;
  const auto c = adamw_step_constants(a);
  const Tensor consts = Tensor::from_vector({c.begin(), c.end()}, {kAdamWConstants}, DType::F64);
  CHECK_THROWS_WITH(adamw_update(p, randn({4}, rng), m, v, a, consts, Tensor::full({2}, 1.0)),
                    Contains("grad_scale") && Contains("one element"));
  CHECK_THROWS_WITH(
      adamw_update(p, randn({4}, rng), m, v, a, consts, Tensor::full({1}, 1.0, DType::F64)),
      Contains("grad_scale") && Contains("f64"));
}

TEST_CASE("index_slice: rows of a vocabulary slice and where the slice holds them", "[forward]") {
  Tensor local = Tensor::empty({6}, DType::I64), here = Tensor::empty({6});
  backend(Device::CPU).index_slice(Tensor::from_indices({9, 10, 14, 15, -100, 12}, {6}), 10, 5,
                                   local, here);
  CHECK(local.to_vector() == std::vector<double>{0, 0, 4, 0, 0, 2});
  CHECK(here.to_vector() == std::vector<double>{0, 1, 1, 0, 0, 1});
}

TEST_CASE("inverse_target_count and clip_factor: the device scalars of a step", "[forward]") {
  Backend& be = backend(Device::CPU);
  Tensor out = Tensor::empty({});
  be.inverse_target_count(Tensor::from_indices({3, -100, 7, 7}, {4}), -100, out);
  CHECK(out.item() == static_cast<float>(1.0 / 3.0));
  be.inverse_target_count(Tensor::from_indices({-100, -100}, {2}), -100, out);
  CHECK(out.item() == 0.0);
  Tensor norm = Tensor::empty({}, DType::F64), factor = Tensor::empty({});
  be.clip_factor(Tensor::scalar(16.0, DType::F64), 1.0, norm, factor);
  CHECK(norm.item() == 4.0);
  CHECK(factor.item() == static_cast<float>(1.0 / (4.0 + 1e-6)));
  be.clip_factor(Tensor::scalar(0.25, DType::F64), 1.0, norm, factor);
  CHECK(factor.item() == 1.0);
  be.clip_factor(Tensor::scalar(16.0, DType::F64), 0.0, norm, factor);  // 0: clipping off
  CHECK(factor.item() == 1.0);
  // cross_entropy divides by the count of targets that are not ignored.
  const Tensor logits = Tensor::zeros({4, 8});
  CHECK(cross_entropy(logits, Tensor::from_indices({3, -100, 7, 7}, {4})).item() ==
        Approx(std::log(8.0)));
}

TEST_CASE("routing, loss and optimizer ops reject bad input naming it", "[errors]") {
  Rng rng(17);
  Tensor table = randn({7, 4}, rng);
  CHECK_THROWS_WITH(embedding(Tensor::from_indices({1, 7, 2}, {3}), table),
                    Contains("embedding") && Contains("ids[1] = 7") && Contains("[0, 7)"));
  CHECK_THROWS_WITH(embedding(Tensor::from_indices({-1}, {1}, DType::I32), table),
                    Contains("embedding") && Contains("ids[0] = -1"));
  CHECK_THROWS_WITH(embedding(Tensor::from_vector({1, 2}, {2}), table),
                    Contains("embedding") && Contains("f32"));
  CHECK_THROWS_WITH(embedding(Tensor::from_indices({1}, {1}), randn({7}, rng)),
                    Contains("embedding") && Contains("[7]"));

  Tensor x = randn({2, 5, 3}, rng);
  Tensor idx = Tensor::from_indices({0, 4, 1, 2}, {2, 2});
  CHECK_THROWS_WITH(gather_rows(x, Tensor::from_indices({0, 4, 5, 1}, {2, 2})),
                    Contains("gather_rows") && Contains("idx[2] = 5") && Contains("[0, 5)"));
  CHECK_THROWS_WITH(gather_rows(x, Tensor::from_indices({0, 1, 2}, {3, 1})),
                    Contains("gather_rows") && Contains("[3, 1]"));
  CHECK_THROWS_WITH(gather_rows(randn({10, 3}, rng), idx),
                    Contains("gather_rows") && Contains("[10, 3]"));
  CHECK_THROWS_WITH(gather_rows(x, Tensor::from_vector({0, 1, 2, 3}, {2, 2})),
                    Contains("gather_rows") && Contains("f32"));
  CHECK_THROWS_WITH(scatter_add_rows(x, idx, randn({2, 3, 3}, rng)),
                    Contains("scatter_add_rows") && Contains("[2, 3, 3]"));
  CHECK_THROWS_WITH(scatter_add_rows(x, idx, randn({2, 2, 3}, rng, DType::F64)),
                    Contains("scatter_add_rows") && Contains("f64"));
  CHECK_THROWS_WITH(
      scatter_add_rows(x, Tensor::from_indices({0, 9, 1, 2}, {2, 2}), randn({2, 2, 3}, rng)),
      Contains("scatter_add_rows") && Contains("idx[1] = 9"));

  Tensor scores = randn({2, 6}, rng);
  CHECK_THROWS_WITH(topk_rows(scores, 7), Contains("topk") && Contains("k = 7"));
  CHECK_THROWS_WITH(topk_rows(scores, 0), Contains("topk") && Contains("k = 0"));
  CHECK_THROWS_WITH(topk_rows(randn({12}, rng), 2), Contains("topk") && Contains("[12]"));

  CHECK_THROWS_WITH(bce_with_logits(randn({3, 4}, rng), randn({4, 3}, rng)),
                    Contains("bce_with_logits") && Contains("[3, 4]") && Contains("[4, 3]"));
  CHECK_THROWS_WITH(bce_with_logits(randn({3}, rng), randn({3}, rng, DType::F64)),
                    Contains("bce_with_logits") && Contains("f64"));

  Tensor p = randn({4, 3}, rng), m = Tensor::zeros({4, 3}), v = Tensor::zeros({4, 3});
  AdamWArgs a;
  CHECK_THROWS_WITH(adamw_update(p, randn({3, 4}, rng), m, v, a),
                    Contains("adamw") && Contains("[3, 4]"));
  CHECK_THROWS_WITH(adamw_update(p, randn({4, 3}, rng, DType::F64), m, v, a),
                    Contains("adamw") && Contains("f64"));
  Tensor v_bad = Tensor::zeros({12});
  CHECK_THROWS_WITH(adamw_update(p, randn({4, 3}, rng), m, v_bad, a),
                    Contains("adamw") && Contains("[12]"));
  a.step = 0;
  CHECK_THROWS_WITH(adamw_update(p, randn({4, 3}, rng), m, v, a),
                    Contains("adamw") && Contains("step = 0"));
}

namespace {
// Targets in [0, v) for n rows, each position in `ignored` set to ignore_index.
Tensor lce_targets(const Shape& s, int64_t v, Rng& rng, std::vector<int64_t> ignored,
                   int64_t ignore_index = -100, DType dtype = DType::I64) {
  std::vector<int64_t> t(static_cast<size_t>(shape_numel(s)));
  for (auto& x : t) x = rng.below(v);
  for (int64_t i : ignored) t[static_cast<size_t>(i)] = ignore_index;
  return Tensor::from_indices(t, s, dtype);
}

// The largest |a - b| over the largest |b|: 0 when bitwise equal.
double rel_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double worst = 0, scale = 1e-300;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, std::abs(a.at(i) - b.at(i)));
    scale = std::max(scale, std::abs(b.at(i)));
  }
  return worst / scale;
}

struct HeadRun {
  double loss;
  Tensor dx, dw;
};

// The loss (times `seed`) of x [2,7,9] through weight [23,9], its gradients, unfused or fused.
HeadRun run_head(const Tensor& x0, const Tensor& w0, const Tensor& t, bool fused,
                 int64_t chunk_rows, double seed, int64_t ignore_index = -100) {
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  const Tensor loss = fused ? linear_cross_entropy(x, w, t, ignore_index, chunk_rows)
                            : cross_entropy(linear(x, w), t, ignore_index);
  CHECK(loss.dim() == 0);
  CHECK(loss.dtype() == x0.dtype());
  scale(loss, seed).backward();
  return {loss.item(), x.grad(), w.grad()};
}
}  // namespace

TEST_CASE("linear_cross_entropy equals cross_entropy of the head's logits, in any chunks",
          "[forward]") {
  Rng rng(31);
  const int64_t v = 23, d = 9;
  for (DType dtype : {DType::F64, DType::F32}) {
    const Tensor x = randn({2, 7, d}, rng, dtype), w = randn({v, d}, rng, dtype, 0.7);
    const Tensor t = lce_targets({2, 7}, v, rng, {2, 9, 13});
    const double tol = dtype == DType::F64 ? 1e-13 : 2e-6;
    const HeadRun ref = run_head(x, w, t, false, 0, 1.0);
    // One chunk does the unfused head's arithmetic in the same order: bitwise equal.
    for (int64_t rows : {int64_t{0}, int64_t{14}, int64_t{100}}) {
      INFO(dtype_name(dtype) << ", one chunk of " << rows << " rows");
      const HeadRun one = run_head(x, w, t, true, rows, 1.0);
      CHECK(one.loss == ref.loss);
      CHECK(rel_diff(one.dx, ref.dx) == 0.0);
      CHECK(rel_diff(one.dw, ref.dw) == 0.0);
    }
    // Several chunks (one of them partial) sum dW chunk by chunk: equal to rounding.
    for (int64_t rows : {int64_t{1}, int64_t{4}, int64_t{13}}) {
      INFO(dtype_name(dtype) << ", chunks of " << rows << " rows");
      const HeadRun many = run_head(x, w, t, true, rows, 1.0);
      CHECK(many.loss == Approx(ref.loss).epsilon(tol));
      CHECK(rel_diff(many.dx, ref.dx) <= tol);
      CHECK(rel_diff(many.dw, ref.dw) <= tol);
    }
    // An incoming gradient other than 1 scales both gradients.
    INFO(dtype_name(dtype) << ", seed 0.37");
    const HeadRun ref_s = run_head(x, w, t, false, 0, 0.37);
    const HeadRun fused_s = run_head(x, w, t, true, 5, 0.37);
    CHECK(rel_diff(fused_s.dx, ref_s.dx) <= tol);
    CHECK(rel_diff(fused_s.dw, ref_s.dw) <= tol);
  }
}

TEST_CASE("linear_cross_entropy: i32 targets, another ignore_index, all ignored, no grad",
          "[forward]") {
  Rng rng(32);
  const Tensor x = randn({6, 5}, rng, DType::F64), w = randn({11, 5}, rng, DType::F64);
  {
    INFO("i32 targets, ignore_index 0");
    const Tensor t = lce_targets({6}, 11, rng, {1, 4}, 0, DType::I32);
    const HeadRun ref = run_head(x, w, t, false, 0, 1.0, 0);
    const HeadRun fused = run_head(x, w, t, true, 4, 1.0, 0);
    CHECK(fused.loss == Approx(ref.loss).epsilon(1e-13));
    CHECK(rel_diff(fused.dx, ref.dx) <= 1e-13);
    CHECK(rel_diff(fused.dw, ref.dw) <= 1e-13);
  }
  {
    INFO("every target ignored: loss 0, zero gradients");
    const Tensor t = Tensor::from_indices(std::vector<int64_t>(6, -100), {6});
    const HeadRun fused = run_head(x, w, t, true, 4, 1.0);
    CHECK(fused.loss == 0.0);
    CHECK(rel_diff(fused.dx, Tensor::zeros({6, 5}, DType::F64)) == 0.0);
    CHECK(rel_diff(fused.dw, Tensor::zeros({11, 5}, DType::F64)) == 0.0);
  }
  {
    INFO("no grad mode: the loss alone, no node");
    const Tensor t = lce_targets({6}, 11, rng, {});
    Tensor xg = x.clone().set_requires_grad(true);
    NoGradGuard no_grad;
    const Tensor loss = linear_cross_entropy(xg, w, t, -100, 2);
    CHECK(!loss.grad_fn());
    CHECK(loss.item() == Approx(cross_entropy(linear(x, w), t).item()).epsilon(1e-13));
  }
  CHECK(linear_cross_entropy_chunk_rows(50304, DType::BF16) == 1334);
  CHECK(linear_cross_entropy_chunk_rows(50304, DType::F32) == 667);
  CHECK(linear_cross_entropy_chunk_rows(int64_t{1} << 30, DType::F64) == 1);
}

TEST_CASE("linear_cross_entropy with tied weights equals the unfused tied head", "[forward]") {
  // The embedding's table is the head's weight: its gradient sums both uses.
  Rng rng(33);
  const int64_t v = 17, d = 6;
  const Tensor w0 = randn({v, d}, rng, DType::F64);
  const Tensor ids = lce_targets({3, 5}, v, rng, {}), t = lce_targets({3, 5}, v, rng, {7});
  Tensor grads[2];
  double losses[2];
  for (int fused = 0; fused < 2; ++fused) {
    Tensor w = w0.clone().set_requires_grad(true);
    const Tensor h = embedding(ids, w);
    const Tensor loss =
        fused ? linear_cross_entropy(h, w, t, -100, 4) : cross_entropy(linear(h, w), t);
    loss.backward();
    losses[fused] = loss.item();
    grads[fused] = w.grad();
  }
  CHECK(losses[1] == Approx(losses[0]).epsilon(1e-13));
  CHECK(rel_diff(grads[1], grads[0]) <= 1e-13);
}

TEST_CASE("linear_cross_entropy rejects bad input naming it", "[errors]") {
  Rng rng(34);
  const Tensor x = randn({4, 3}, rng), w = randn({5, 3}, rng);
  const Tensor t = Tensor::from_indices({0, 1, 2, 3}, {4});
  CHECK_THROWS_WITH(linear_cross_entropy(x, randn({5, 4}, rng), t),
                    Contains("linear_cross_entropy") && Contains("[4, 3]") && Contains("[5, 4]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, randn({5, 3}, rng, DType::F64), t),
                    Contains("linear_cross_entropy") && Contains("f64"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, Tensor::from_indices({0, 1, 2}, {3})),
                    Contains("linear_cross_entropy") && Contains("[3]") && Contains("[4]"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, Tensor::from_indices({0, 5, 2, 3}, {4})),
                    Contains("linear_cross_entropy") && Contains("targets[1] = 5") &&
                        Contains("[0, 5)"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, Tensor::from_vector({0, 1, 2, 3}, {4})),
                    Contains("linear_cross_entropy") && Contains("f32"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, w, t, -100, -1),
                    Contains("linear_cross_entropy") && Contains("chunk_rows -1"));
  CHECK_THROWS_WITH(linear_cross_entropy(x, randn({0, 3}, rng), t),
                    Contains("linear_cross_entropy") && Contains("[0, 3]"));
}

// The multi-tensor update is adamw_update over every slot in one pass: bitwise the same
// parameters and moments for every dtype, both decay groups, a gradient scale, an empty
// parameter among the others and several steps; a weight copy it writes is the new parameter
// converted to the copy's dtype, exactly as convert makes it.
TEST_CASE("adamw_update_multi equals adamw_update on every tensor, bitwise", "[forward]") {
  AdamWArgs hyper;
  hyper.weight_decay = 0.1;
  for (DType dtype : {DType::F32, DType::F64}) {
    INFO(dtype_name(dtype));
    Rng rng(23);
    AdamWStepConstants consts(hyper, Device::CPU);
    const std::vector<Shape> shapes = {{7, 5}, {0}, {3}, {2, 3, 4}};
    std::vector<Tensor> p, m, v, q, mq, vq, copies;
    for (const Shape& s : shapes) {
      p.push_back(randn(s, rng, dtype));
      q.push_back(p.back().clone());
      for (auto* t : {&m, &v, &mq, &vq}) t->push_back(Tensor::zeros(s, dtype));
      copies.push_back(Tensor::zeros(s, dtype == DType::F32 ? DType::F64 : DType::F32));
    }
    MultiTensorTable table;
    for (int64_t step = 1; step <= 3; ++step) {
      consts.set(1e-2 * static_cast<double>(step), step);
      const Tensor scale = Tensor::full({1}, step == 2 ? 0.5 : 1.0, dtype);
      std::vector<AdamWSlot> slots;
      for (size_t i = 0; i < shapes.size(); ++i) {
        const Tensor g = randn(shapes[i], rng, dtype);
        const bool decays = i % 2 == 0;
        slots.push_back({p[i], g, m[i], v[i], consts.tensor(decays), i == 1 ? Tensor() : copies[i]});
        adamw_update(q[i], g, mq[i], vq[i], consts.args(decays), consts.tensor(decays), scale);
      }
      adamw_update_multi(slots, consts.args(true), scale, table);
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      INFO("tensor " << i);
      CHECK(p[i].to_vector() == q[i].to_vector());
      CHECK(m[i].to_vector() == mq[i].to_vector());
      CHECK(v[i].to_vector() == vq[i].to_vector());
      CHECK(copies[i].to_vector() == p[i].to(copies[i].dtype()).to_vector());
    }
  }
}

TEST_CASE("adamw_update_multi names what is wrong with a slot", "[forward]") {
  Rng rng(3);
  AdamWStepConstants consts(AdamWArgs{}, Device::CPU);
  consts.set(1e-3, 1);
  MultiTensorTable table;
  auto slot = [&](DType dtype, Shape copy_shape, DType copy_dtype) {
    return AdamWSlot{randn({4}, rng, dtype), randn({4}, rng, dtype), Tensor::zeros({4}, dtype),
                     Tensor::zeros({4}, dtype), consts.tensor(true),
                     Tensor::zeros(copy_shape, copy_dtype)};
  };
  CHECK_THROWS_WITH(adamw_update_multi({slot(DType::F32, {4}, DType::F64),
                                        slot(DType::F64, {4}, DType::F64)},
                                       consts.args(true), Tensor(), table),
                    Contains("adamw") && Contains("f64"));
  CHECK_THROWS_WITH(adamw_update_multi({slot(DType::F32, {3}, DType::F64)}, consts.args(true),
                                       Tensor(), table),
                    Contains("copy") && Contains("differs in size"));
  CHECK_THROWS_WITH(adamw_update_multi({slot(DType::F32, {4}, DType::F64),
                                        slot(DType::F32, {4}, DType::F32)},
                                       consts.args(true), Tensor(), table),
                    Contains("the first copy"));
  AdamWArgs bad = consts.args(true);
  bad.step = 0;
  CHECK_THROWS_WITH(adamw_update_multi({slot(DType::F32, {4}, DType::F64)}, bad, Tensor(), table),
                    Contains("step = 0"));
}

// The norm's one pass: every list sums to the naive double sum of squares (tensors in order,
// elements in order), within 1e-12 relative (OpenMP splits the large tensor's sum). The list
// holds tensors past kParallelElements and past kMultiTensorChunk, zero-sized ones, and narrow0
// views at non-zero storage offsets, including an empty one. (The CPU has no bf16 kernels:
// bf16 is tests/cuda/parity_nn_test.cpp's.)
TEST_CASE("sum_squares_multi matches a naive double reference over lists of tensors and views",
          "[forward]") {
  for (DType dtype : {DType::F32, DType::F64}) {
    INFO(dtype_name(dtype));
    Rng rng(41);
    const Tensor big = randn({kMultiTensorChunk + 300, 3}, rng, dtype);
    const std::vector<std::vector<Tensor>> lists = {
        {},
        {Tensor::zeros({0}, dtype), Tensor::zeros({4, 0}, dtype)},
        {randn({7}, rng, dtype)},
        {randn({3, 5}, rng, dtype), Tensor::zeros({0}, dtype), randn({100003}, rng, dtype),
         big.narrow0(5, 2), big.narrow0(kMultiTensorChunk - 1, 300), big.narrow0(17, 0),
         randn({2, 3, 4}, rng, dtype)},
        {big, big.narrow0(1, kMultiTensorChunk)},
    };
    for (size_t l = 0; l < lists.size(); ++l) {
      INFO("list " << l);
      double want = 0;
      for (const Tensor& x : lists[l]) {
        const std::vector<double> v = x.to_vector();
        for (double e : v) want += e * e;
      }
      MultiTensorTable table;
      const Tensor got = sum_squares_multi(lists[l], Device::CPU, table);
      CHECK(got.dtype() == DType::F64);
      CHECK(got.numel() == 1);
      CHECK(got.item() == Approx(want).epsilon(1e-12).margin(0));
      CHECK(sum_squares_multi(lists[l], Device::CPU, table).item() == got.item());  // again
    }
  }
}

// The table's rows: a tensor's address (a view's own first element), numel and first chunk;
// rewritten only when the list changed.
TEST_CASE("sum_squares_multi's table is rewritten only when a tensor moved", "[forward]") {
  Rng rng(43);
  const Tensor a = randn({kMultiTensorChunk + 1}, rng), b = randn({10, 4}, rng);
  const Tensor view = b.narrow0(3, 2);
  MultiTensorTable table;
  bool rewrite = false;
  std::vector<MultiTensorEntry> rows = table.rows_for({a, Tensor::zeros({0}), view}, rewrite);
  CHECK(rewrite);
  REQUIRE(rows.size() == 2);  // the empty tensor has no row
  CHECK(rows[0].grad == a.raw_data());
  CHECK(rows[0].numel == kMultiTensorChunk + 1);
  CHECK(rows[0].first_chunk == 0);
  CHECK(rows[1].grad == static_cast<const float*>(b.raw_data()) + 12);
  CHECK(rows[1].numel == 8);
  CHECK(rows[1].first_chunk == 2);
  CHECK((rows[1].param == nullptr && rows[1].m == nullptr && rows[1].copy == nullptr));
  table.rows_for({a, Tensor::zeros({0}), view}, rewrite);
  CHECK_FALSE(rewrite);
  table.rows_for({a, b.narrow0(4, 2)}, rewrite);
  CHECK(rewrite);
  table.rows_for({a}, rewrite);
  CHECK(rewrite);
}

TEST_CASE("sum_squares_multi names a tensor of another dtype", "[errors]") {
  Rng rng(44);
  MultiTensorTable table;
  CHECK_THROWS_WITH(sum_squares_multi({randn({3}, rng), randn({3}, rng, DType::F64)}, Device::CPU,
                                      table),
                    Contains("sum_squares_multi") && Contains("f64"));
  CHECK_THROWS_WITH(sum_squares_multi({Tensor::zeros({3}, DType::I64)}, Device::CPU, table),
                    Contains("sum_squares_multi") && Contains("i64"));
}

// A weight copy is read only while current: autocast hands out the copy the optimizer wrote, and
// rewrites it first after any other write of the master (here copy_from, set and a per-tensor
// update), so what a forward reads always equals cast(master).
TEST_CASE("a stale weight copy is rewritten before autocast reads it", "[forward]") {
  Rng rng(5);
  Tensor w = randn({3, 4}, rng).set_requires_grad(true);
  keep_weight_copy(w, DType::F64);
  CHECK_FALSE(allocated_weight_copy(w).defined());  // made when first read
  auto read = [&] {
    AutocastGuard f64(DType::F64);
    return autocast(w);
  };
  auto current = [&] { return read().to_vector() == w.to(DType::F64).to_vector(); };
  const Tensor first = read();
  CHECK(first.dtype() == DType::F64);
  const Tensor copy = allocated_weight_copy(w);
  REQUIRE(copy.defined());
  CHECK(first.raw_data() == copy.raw_data());  // no new tensor: the copy itself
  CHECK(current());
  w.copy_from(randn({3, 4}, rng));
  CHECK(current());
  w.set(5, 42.0);
  CHECK(current());
  Tensor m = Tensor::zeros({3, 4}), v = Tensor::zeros({3, 4});
  AdamWArgs a;
  adamw_update(w, randn({3, 4}, rng), m, v, a);
  CHECK(current());
  // The multi-tensor update writes the copy with the master: current without a rewrite.
  AdamWStepConstants consts(a, Device::CPU);
  consts.set(1e-2, 1);
  MultiTensorTable table;
  adamw_update_multi({{w, randn({3, 4}, rng), m, v, consts.tensor(true), copy}}, a,
                     Tensor(), table);
  CHECK(copy.to_vector() == w.to(DType::F64).to_vector());
  CHECK(current());
  // The gradient reaches the master in its own dtype, as through cast.
  {
    AutocastGuard f64(DType::F64);
    sum(mul(autocast(w), autocast(w))).backward();
  }
  CHECK(w.grad().dtype() == DType::F32);
  const Tensor want = w.to(DType::F64);
  for (int64_t i = 0; i < w.numel(); ++i) CHECK(w.grad().at(i) == static_cast<float>(2 * want.at(i)));
  drop_weight_copy(w);
  CHECK_FALSE(allocated_weight_copy(w).defined());
}
