// Norms, activations, softmax, logsumexp and cross-entropy: f32 forwards against naive double
// references (including shapes past the OpenMP threshold and rows longer than the online-softmax
// chunk), f32 gradients against the f64 ones, and argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <numbers>

#include "core/all_ops.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {

void check_close(const Tensor& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    const double w = want[static_cast<size_t>(i)];
    if (std::abs(got.at(i) - w) > tol * (1.0 + std::abs(w))) {
      ++bad;
      INFO("element " << i);
      CHECK(got.at(i) == Approx(w).margin(tol).epsilon(tol));
    }
  }
  CHECK(bad == 0);
}

// max |got - want| <= tol * max |want|: for gradients, whose scale varies by op.
void check_close_scaled(const Tensor& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  double scale = 0, worst = 0;
  int64_t worst_i = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double err = std::abs(got.at(i) - want[static_cast<size_t>(i)]);
    if (err > worst) worst = err, worst_i = i;
  }
  INFO("worst element " << worst_i << ": " << got.at(worst_i) << " vs "
                        << want[static_cast<size_t>(worst_i)] << ", scale " << scale);
  CHECK(scale > 0);
  CHECK(worst <= tol * scale);
}

// Applies f(row values) -> row outputs to every row of x [..., D].
std::vector<double> per_row(const Tensor& x,
                            const std::function<std::vector<double>(std::vector<double>)>& f) {
  const int64_t d = x.size(-1), n = x.numel() / d;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> row(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i) row[static_cast<size_t>(i)] = x.at(r * d + i);
    for (double y : f(row)) out.push_back(y);
  }
  return out;
}

std::vector<double> pointwise(const Tensor& x, const std::function<double(double)>& f) {
  std::vector<double> out(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) out[static_cast<size_t>(i)] = f(x.at(i));
  return out;
}

double naive_gelu(double v) {
  return 0.5 * v *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
}
double naive_silu(double v) {
  return v / (1.0 + std::exp(-v));
}

// Logits with a drift along each row, so a long row's maximum sits in a late chunk.
Tensor drifting_logits(const Shape& s, Rng& rng) {
  Tensor x = randn(s, rng, DType::F32, 3.0);
  const int64_t v = s.back();
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, x.at(i) + 8.0 * (i % v) / v);
  return x;
}

}  // namespace

TEST_CASE("rmsnorm and layernorm forward match a naive reference in f32", "[forward]") {
  Rng rng(11);
  for (Shape s : {Shape{3, 17}, Shape{2, 5, 33}, Shape{300, 130}}) {
    DYNAMIC_SECTION("x " << shape_str(s)) {
      const int64_t d = s.back();
      Tensor x = randn(s, rng, DType::F32, 2.0, 0.5);
      Tensor w = randn({d}, rng), b = randn({d}, rng);
      check_close(rmsnorm(x, w, 1e-5),
                  per_row(x,
                          [&](std::vector<double> row) {
                            double ss = 0;
                            for (double v : row) ss += v * v;
                            const double r = 1.0 / std::sqrt(ss / d + 1e-5);
                            for (int64_t i = 0; i < d; ++i) row[i] *= r * w.at(i);
                            return row;
                          }),
                  1e-5);
      check_close(layernorm(x, w, b, 1e-5),
                  per_row(x,
                          [&](std::vector<double> row) {
                            double mu = 0, var = 0;
                            for (double v : row) mu += v / d;
                            for (double v : row) var += (v - mu) * (v - mu) / d;
                            const double r = 1.0 / std::sqrt(var + 1e-5);
                            for (int64_t i = 0; i < d; ++i)
                              row[i] = (row[i] - mu) * r * w.at(i) + b.at(i);
                            return row;
                          }),
                  1e-5);
    }
  }
}

TEST_CASE("gelu, silu and swiglu forward match a naive reference in f32", "[forward]") {
  Rng rng(12);
  for (Shape s : {Shape{7}, Shape{3, 17}, Shape{50, 999}}) {
    DYNAMIC_SECTION("x " << shape_str(s)) {
      Tensor x = randn(s, rng, DType::F32, 4.0), up = randn(s, rng);
      check_close(gelu(x), pointwise(x, naive_gelu), 1e-6);
      check_close(silu(x), pointwise(x, naive_silu), 1e-6);
      check_close(sigmoid(x), pointwise(x, [](double v) { return 1 / (1 + std::exp(-v)); }), 1e-6);
      std::vector<double> want(static_cast<size_t>(x.numel()));
      for (int64_t i = 0; i < x.numel(); ++i) want[i] = naive_silu(x.at(i)) * up.at(i);
      check_close(swiglu(x, up), want, 1e-6);
    }
  }
  SECTION("extreme inputs saturate without NaN") {
    Tensor x = Tensor::from_vector({-1e4, -200, -90, -30, 0, 30, 90, 200, 1e4}, {9});
    check_close(gelu(x), pointwise(x, naive_gelu), 1e-6);
    check_close(silu(x), pointwise(x, naive_silu), 1e-6);
  }
}

TEST_CASE("softmax forward matches a naive reference in f32", "[forward]") {
  Rng rng(13);
  for (Shape s : {Shape{3, 17}, Shape{2, 4, 33}, Shape{40, 1000}, Shape{3, 5000}}) {
    DYNAMIC_SECTION("x " << shape_str(s)) {
      Tensor x = drifting_logits(s, rng);
      Tensor y = softmax(x);
      CHECK(y.shape() == s);
      check_close(y,
                  per_row(x,
                          [](std::vector<double> row) {
                            double m = -INFINITY, z = 0;
                            for (double v : row) m = std::max(m, v);
                            for (double& v : row) z += (v = std::exp(v - m));
                            for (double& v : row) v /= z;
                            return row;
                          }),
                  1e-5);
    }
  }
}

TEST_CASE("logsumexp forward matches a direct log(sum(exp(x))) in f32 and f64", "[forward]") {
  Rng rng(19);
  for (DType dt : {DType::F32, DType::F64}) {
    for (Shape s : {Shape{7}, Shape{3, 17}, Shape{2, 4, 33}, Shape{40, 1000}, Shape{3, 5000}}) {
      DYNAMIC_SECTION(dtype_name(dt) << " x " << shape_str(s)) {
        Tensor x = drifting_logits(s, rng).to(dt);
        Tensor y = logsumexp(x);
        CHECK(y.shape() == Shape(s.begin(), s.end() - 1));
        CHECK(y.dtype() == dt);
        // No max subtracted: these logits are small enough for exp in double.
        const int64_t v = s.back();
        std::vector<double> want;
        for (int64_t r = 0; r < x.numel() / v; ++r) {
          double z = 0;
          for (int64_t i = 0; i < v; ++i) z += std::exp(x.at(r * v + i));
          want.push_back(std::log(z));
        }
        check_close(y, want, dt == DType::F32 ? 1e-6 : 1e-12);
      }
    }
  }
  SECTION("large and infinite logits: no overflow, and the gradient is softmax") {
    const double inf = INFINITY;
    for (DType dt : {DType::F32, DType::F64}) {
      DYNAMIC_SECTION(dtype_name(dt)) {
        // exp(89) overflows f32 and exp(710) overflows f64; the naive sum would be inf.
        Tensor x = Tensor::from_vector({1000, 1001, 999,     //
                                        -1000, -1001, -999,  //
                                        89, 89, 89,          //
                                        -inf, 0, -inf,       //
                                        -inf, -inf, -inf,    //
                                        3, inf, -inf},
                                       {6, 3}, dt);
        const std::vector<double> want = {1001 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)),
                                          -999 + std::log(1 + std::exp(-1.0) + std::exp(-2.0)),
                                          89 + std::log(3.0),
                                          0,
                                          -inf,
                                          inf};
        Tensor y = logsumexp(x);
        for (int64_t r = 0; r < 6; ++r) {
          INFO("row " << r);
          if (std::isinf(want[r]))
            CHECK(y.at(r) == want[r]);
          else
            CHECK(y.at(r) == Approx(want[r]).epsilon(1e-7));
        }
        // d lse / dx = softmax(x) = exp(x - lse), scaled by the seed; rows 0-3 are finite.
        const std::vector<double> seed = {1, 2, -1, 0.5};
        Tensor xs = x.narrow0(0, 4).clone().set_requires_grad(true);
        logsumexp(xs).backward(Tensor::from_vector(seed, {4}, dt));
        std::vector<double> want_dx;
        for (int64_t r = 0; r < 4; ++r)
          for (int64_t i = 0; i < 3; ++i)
            want_dx.push_back(seed[r] * std::exp(x.at(r * 3 + i) - want[r]));
        check_close(xs.grad(), want_dx, dt == DType::F32 ? 1e-6 : 1e-12);
      }
    }
  }
}

TEST_CASE("cross_entropy forward matches a naive mean over non-ignored targets", "[forward]") {
  Rng rng(14);
  for (Shape s : {Shape{5, 17}, Shape{2, 3, 33}, Shape{64, 1000}, Shape{3, 5000}}) {
    DYNAMIC_SECTION("logits " << shape_str(s)) {
      Tensor x = drifting_logits(s, rng);
      const int64_t v = s.back(), n = x.numel() / v;
      std::vector<int64_t> t(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) t[i] = i % 3 == 1 ? -100 : rng.below(v);
      const Shape lead(s.begin(), s.end() - 1);
      double total = 0;
      int64_t count = 0;
      for (int64_t r = 0; r < n; ++r) {
        if (t[r] == -100) continue;
        double m = -INFINITY, z = 0;
        for (int64_t i = 0; i < v; ++i) m = std::max(m, x.at(r * v + i));
        for (int64_t i = 0; i < v; ++i) z += std::exp(x.at(r * v + i) - m);
        total += m + std::log(z) - x.at(r * v + t[r]);
        ++count;
      }
      for (DType dt : {DType::I64, DType::I32}) {
        Tensor loss = cross_entropy(x, Tensor::from_indices(t, lead, dt));
        CHECK(loss.dim() == 0);
        CHECK(loss.item() == Approx(total / count).epsilon(1e-5));
      }
    }
  }
  SECTION("backward uses the targets the forward saw, even if the buffer is refilled") {
    Tensor x = randn({4, 9}, rng).set_requires_grad(true);
    Tensor t = Tensor::from_indices({1, -100, 8, 0}, {4});
    Tensor loss = cross_entropy(x, t);
    for (int64_t i = 0; i < 4; ++i) t.set(i, 3);
    loss.backward();
    // d/dx = (softmax - onehot) / 3 on rows 0, 2, 3; row 1 ignored.
    const std::vector<int64_t> want_t = {1, -100, 8, 0};
    for (int64_t r = 0; r < 4; ++r) {
      double m = -INFINITY, z = 0;
      for (int64_t i = 0; i < 9; ++i) m = std::max(m, x.at(r * 9 + i));
      for (int64_t i = 0; i < 9; ++i) z += std::exp(x.at(r * 9 + i) - m);
      for (int64_t i = 0; i < 9; ++i) {
        const double p = std::exp(x.at(r * 9 + i) - m) / z;
        const double want = want_t[r] < 0 ? 0.0 : (p - (i == want_t[r] ? 1.0 : 0.0)) / 3.0;
        CHECK(x.grad().at(r * 9 + i) == Approx(want).margin(1e-6));
      }
    }
  }
  SECTION("every target ignored gives 0") {
    Tensor x = randn({2, 9}, rng);
    CHECK(cross_entropy(x, Tensor::from_indices({5, 5}, {2}), 5).item() == 0.0);
  }
}

TEST_CASE("f32 gradients agree with f64 ones, past the parallel threshold", "[forward]") {
  Rng rng(15);
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  const Tensor t = [&] {
    std::vector<int64_t> v(64 * 3);
    for (size_t i = 0; i < v.size(); ++i) v[i] = i % 7 == 0 ? -100 : rng.below(3000);
    return Tensor::from_indices(v, {64, 3});
  }();
  struct Case {
    const char* name;
    std::vector<Shape> shapes;
    Fn f;
  };
  const std::vector<Case> cases = {
      {"rmsnorm", {{257, 130}, {130}}, [](auto& in) { return rmsnorm(in[0], in[1]); }},
      {"layernorm",
       {{257, 130}, {130}, {130}},
       [](auto& in) { return layernorm(in[0], in[1], in[2]); }},
      {"gelu", {{300, 129}}, [](auto& in) { return gelu(in[0]); }},
      {"silu", {{300, 129}}, [](auto& in) { return silu(in[0]); }},
      {"swiglu", {{300, 129}, {300, 129}}, [](auto& in) { return swiglu(in[0], in[1]); }},
      {"softmax", {{13, 3000}}, [](auto& in) { return softmax(in[0]); }},
      {"logsumexp", {{13, 3000}}, [](auto& in) { return logsumexp(in[0]); }},
      {"cross_entropy", {{64, 3, 3000}}, [&](auto& in) { return cross_entropy(in[0], t); }},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      std::vector<Tensor> in32, in64;
      for (const Shape& s : c.shapes) {
        in64.push_back(randn(s, rng, DType::F64, 2.0).set_requires_grad(true));
        in32.push_back(in64.back().to(DType::F32).set_requires_grad(true));
      }
      Tensor out64 = c.f(in64), out32 = c.f(in32);
      Tensor seed64 = randn(out64.shape(), rng, DType::F64);
      out64.backward(seed64);
      out32.backward(seed64.to(DType::F32));
      for (size_t i = 0; i < in64.size(); ++i) {
        INFO("input " << i);
        check_close_scaled(in32[i].grad(), in64[i].grad().to_vector(), 1e-5);
      }
    }
  }
}

// The gradient-check cases are below the OpenMP threshold; here the per-thread dweight/dbias
// partial sums of the parallel path are checked against finite differences in f64.
TEST_CASE("parallel norm backward matches finite differences for every parameter", "[forward]") {
  Rng rng(18);
  const int64_t n = 257, d = 130;  // 33410 elements: past kParallelElements
  Tensor x = randn({n, d}, rng, DType::F64, 2.0).set_requires_grad(true);
  Tensor w = randn({d}, rng, DType::F64).set_requires_grad(true);
  Tensor b = randn({d}, rng, DType::F64).set_requires_grad(true);
  Tensor r = randn({n, d}, rng, DType::F64);
  for (bool layer : {false, true}) {
    DYNAMIC_SECTION((layer ? "layernorm" : "rmsnorm")) {
      auto loss = [&] {
        Tensor y = layer ? layernorm(x, w, b) : rmsnorm(x, w);
        double s = 0;
        for (int64_t i = 0; i < y.numel(); ++i) s += y.at(i) * r.at(i);
        return s;
      };
      Tensor y = layer ? layernorm(x, w, b) : rmsnorm(x, w);
      y.backward(r);
      std::vector<Tensor> params = {w};
      if (layer) params.push_back(b);
      params.push_back(x);
      for (Tensor& p : params) {
        const int64_t stride = p.numel() > d ? 997 : 1;  // every parameter, a sample of x
        for (int64_t e = 0; e < p.numel(); e += stride) {
          const double orig = p.at(e), h = 1e-6;
          double plus, minus;
          {
            NoGradGuard no_grad;
            p.set(e, orig + h);
            plus = loss();
            p.set(e, orig - h);
            minus = loss();
            p.set(e, orig);
          }
          const double numeric = (plus - minus) / (2 * h);
          INFO(describe(p) << " element " << e);
          CHECK(p.grad().at(e) == Approx(numeric).margin(1e-5).epsilon(1e-6));
        }
        p.zero_grad();
      }
    }
  }
}

TEST_CASE("norm, activation and softmax ops reject bad arguments by name", "[errors]") {
  Rng rng(16);
  Tensor x = randn({4, 5}, rng);
  Tensor w5 = randn({5}, rng);
  CHECK_THROWS_WITH(rmsnorm(x, randn({4}, rng)), Contains("rmsnorm") && Contains("[4]"));
  CHECK_THROWS_WITH(rmsnorm(x, randn({5}, rng, DType::F64)),
                    Contains("rmsnorm") && Contains("f64"));
  CHECK_THROWS_WITH(rmsnorm(Tensor::zeros({4, 5}, DType::I64), w5),
                    Contains("rmsnorm") && Contains("i64"));
  CHECK_THROWS_WITH(rmsnorm(x, w5, -1.0), Contains("rmsnorm") && Contains("eps"));
  CHECK_THROWS_WITH(rmsnorm(Tensor::zeros({4, 0}), Tensor::zeros({0})),
                    Contains("rmsnorm") && Contains("[4, 0]"));
  CHECK_THROWS_WITH(layernorm(x, w5, randn({6}, rng)), Contains("layernorm") && Contains("[6]"));
  CHECK_THROWS_WITH(layernorm(x, randn({5, 1}, rng), w5),
                    Contains("layernorm") && Contains("[5, 1]"));
  CHECK_THROWS_WITH(gelu(Tensor::zeros({3}, DType::I32)), Contains("gelu") && Contains("i32"));
  CHECK_THROWS_WITH(silu(Tensor()), Contains("silu") && Contains("undefined"));
  CHECK_THROWS_WITH(swiglu(randn({3, 4}, rng), randn({4, 3}, rng)),
                    Contains("swiglu") && Contains("[3, 4]") && Contains("[4, 3]"));
  CHECK_THROWS_WITH(swiglu(x, x.to(DType::F64)), Contains("swiglu") && Contains("f64"));
  CHECK_THROWS_WITH(softmax(Tensor::zeros({2}, DType::I64)),
                    Contains("softmax") && Contains("i64"));
  CHECK_THROWS_WITH(logsumexp(Tensor::zeros({2}, DType::I32)),
                    Contains("logsumexp") && Contains("i32"));
  CHECK_THROWS_WITH(logsumexp(Tensor::zeros({4, 0})), Contains("logsumexp") && Contains("[4, 0]"));
  CHECK_THROWS_WITH(logsumexp(Tensor::zeros({})), Contains("logsumexp") && Contains("[]"));
}

TEST_CASE("cross_entropy rejects bad targets, naming the index", "[errors]") {
  Rng rng(17);
  Tensor logits = randn({2, 3, 10}, rng);
  CHECK_THROWS_WITH(
      cross_entropy(logits, Tensor::from_indices({1, 2, 3, 4, 17, 5}, {2, 3})),
      Contains("cross_entropy") && Contains("targets[4] = 17") && Contains("[0, 10)"));
  CHECK_THROWS_WITH(
      cross_entropy(logits, Tensor::from_indices({1, -1, 3, 4, 5, 6}, {2, 3}, DType::I32)),
      Contains("cross_entropy") && Contains("targets[1] = -1"));
  // -100 is ignored by default, but not when another ignore_index is given.
  CHECK_NOTHROW(cross_entropy(logits, Tensor::from_indices({1, -100, 3, 4, 5, 6}, {2, 3})));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_indices({1, -100, 3, 4, 5, 6}, {2, 3}), 0),
                    Contains("cross_entropy") && Contains("targets[1] = -100"));
  CHECK_THROWS_WITH(cross_entropy(logits, Tensor::from_indices({1, 2, 3, 4, 5, 6}, {3, 2})),
                    Contains("cross_entropy") && Contains("[3, 2]") && Contains("[2, 3]"));
  CHECK_THROWS_WITH(cross_entropy(logits, randn({2, 3}, rng)),
                    Contains("cross_entropy") && Contains("f32"));
  CHECK_THROWS_WITH(
      cross_entropy(Tensor::zeros({2, 3}, DType::I64), Tensor::zeros({2}, DType::I64)),
      Contains("cross_entropy") && Contains("i64"));
  CHECK_THROWS_WITH(cross_entropy(Tensor::zeros({2, 0}), Tensor::zeros({2}, DType::I64)),
                    Contains("cross_entropy") && Contains("[2, 0]"));
}
