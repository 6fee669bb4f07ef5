// Fused causal attention and rope against naive double-precision references in f32: the
// forward (and lse) across tile sizes and the parallel threshold, the tiled backward, the MoD
// property (a gathered sub-sequence attends exactly as the full sequence restricted to it),
// rope's rotation and its inverse, and argument errors.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/all_ops.h"
#include "core/backend.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {

// A row repeated over the batch, flattened: [B, n].
std::vector<int64_t> repeat(int64_t batch, const std::vector<int64_t>& row) {
  std::vector<int64_t> all;
  for (int64_t b = 0; b < batch; ++b) all.insert(all.end(), row.begin(), row.end());
  return all;
}

Tensor pos_rows(int64_t batch, const std::vector<int64_t>& row, DType dtype = DType::I64) {
  return Tensor::from_indices(repeat(batch, row), {batch, static_cast<int64_t>(row.size())}, dtype);
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0, int64_t step = 1) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + i * step;
  return v;
}

// Naive attention in double, straight from the definition, with its gradients for dout.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference naive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::vector<int64_t>& qp, const std::vector<int64_t>& kp,
                          const Tensor& dout = Tensor()) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), D = q.size(3), S = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Reference r;
  r.out.assign(q.numel(), 0.0);
  r.lse.assign(B * H * T, 0.0);
  r.dq.assign(q.numel(), 0.0);
  r.dk.assign(k.numel(), 0.0);
  r.dv.assign(k.numel(), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * H + h) * D; };
  auto ki = [&](int64_t b, int64_t s, int64_t h) { return ((b * S + s) * H + h) * D; };
  std::vector<double> p(S), dp(S);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        double mx = -INFINITY;
        for (int64_t s = 0; s < S; ++s) {
          p[s] = -INFINITY;
          if (kp[b * S + s] > qp[b * T + t]) continue;  // causal mask by position
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q.at(qi(b, t, h) + d) * k.at(ki(b, s, h) + d);
          p[s] = dot * scale;
          mx = std::max(mx, p[s]);
        }
        if (mx == -INFINITY) {  // sees no key: out 0, lse -inf, no gradient (the empty sum)
          r.lse[(b * H + h) * T + t] = -INFINITY;
          continue;
        }
        double sum = 0;
        for (int64_t s = 0; s < S; ++s) sum += p[s] = std::exp(p[s] - mx);
        r.lse[(b * H + h) * T + t] = mx + std::log(sum);
        for (int64_t s = 0; s < S; ++s) {
          p[s] /= sum;
          for (int64_t d = 0; d < D; ++d) r.out[qi(b, t, h) + d] += p[s] * v.at(ki(b, s, h) + d);
        }
        if (!dout.defined()) continue;
        double dot_pdp = 0;  // sum_s P dP
        for (int64_t s = 0; s < S; ++s) {
          dp[s] = 0;
          for (int64_t d = 0; d < D; ++d) dp[s] += dout.at(qi(b, t, h) + d) * v.at(ki(b, s, h) + d);
          dot_pdp += p[s] * dp[s];
        }
        for (int64_t s = 0; s < S; ++s) {
          const double ds = p[s] * (dp[s] - dot_pdp) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dq[qi(b, t, h) + d] += ds * k.at(ki(b, s, h) + d);
            r.dk[ki(b, s, h) + d] += ds * q.at(qi(b, t, h) + d);
            r.dv[ki(b, s, h) + d] += p[s] * dout.at(qi(b, t, h) + d);
          }
        }
      }
  return r;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    if (got.at(i) == want[i] || std::abs(got.at(i) - want[i]) <= tol * (1 + std::abs(want[i])))
      continue;
    ++bad;
    INFO("element " << i);
    CHECK(got.at(i) == Approx(want[i]).margin(tol).epsilon(tol));
  }
  CHECK(bad == 0);
}

struct AttnCase {
  const char* name;
  int64_t B, H, D;
  std::vector<int64_t> qp, kp;  // one row, repeated over the batch
};

}  // namespace

TEST_CASE("attention forward and lse match naive masked softmax(QK^T/sqrt(d))V in f32",
          "[forward]") {
  std::vector<int64_t> gathered = {1, 4, 5, 9, 12, 13, 20, 31, 32, 33, 47, 50, 64, 65, 90};
  std::vector<int64_t> sparse;  // 150 increasing positions with irregular gaps
  for (int64_t i = 0, p = 2; i < 150; ++i) sparse.push_back(p += 1 + (i * 7) % 5);
  const std::vector<AttnCase> cases = {
      {"self [2,5,3,8] pos 0..4", 2, 3, 8, iota(5), iota(5)},
      {"self T=300 [1,300,2,64] (5 tiles, parallel)", 1, 2, 64, iota(300), iota(300)},
      {"gathered pos {1,4,5,9,12,...} [2,15,3,16]", 2, 3, 16, gathered, gathered},
      {"irregular gaps T=150 [2,150,2,24]", 2, 2, 24, sparse, sparse},
      {"S>T: q 40 at the end of k 150 [2,40,2,32]", 2, 2, 32, iota(40, 110), iota(150)},
      // Query tiles of 64 and 48 rows: the 8x32 and 16x16 AVX-512 blockings, both skipping.
      {"two blockings [2,112,2,48]", 2, 2, 48, iota(112), iota(112)},
      // Blocks whose first key is their last query (the edge of the causal skip).
      {"S>T: q 70 at 153 of k 223 [1,70,2,32]", 1, 2, 32, iota(70, 153), iota(223)},
      {"odd q pos between even k pos [1,70,3,8]x[1,140,3,8]", 1, 3, 8, iota(70, 1, 2),
       iota(140, 0, 2)},
  };
  Rng rng(11);
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const int64_t T = c.qp.size(), S = c.kp.size();
      Tensor q = randn({c.B, T, c.H, c.D}, rng), k = randn({c.B, S, c.H, c.D}, rng),
             v = randn({c.B, S, c.H, c.D}, rng);
      const Reference want = naive_attention(q, k, v, repeat(c.B, c.qp), repeat(c.B, c.kp));
      for (DType pd : {DType::I64, DType::I32}) {
        Tensor qp = pos_rows(c.B, c.qp, pd), kp = pos_rows(c.B, c.kp, pd);
        check_close(attention(q, k, v, qp, kp), want.out, 2e-5);
        Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({c.B, c.H, T});
        backend(Device::CPU).attention_forward(q, k, v, qp, kp, out, lse);
        check_close(lse, want.lse, 2e-5);
      }
    }
  }
}

TEST_CASE("attention backward across tiles matches the naive gradients in f32", "[backward]") {
  std::vector<int64_t> sparse;
  for (int64_t i = 0, p = 0; i < 150; ++i) sparse.push_back(p += 1 + (i * 5) % 4);
  const std::vector<AttnCase> cases = {
      {"self T=300 [1,300,2,32]", 1, 2, 32, iota(300), iota(300)},
      {"irregular gaps T=150 [2,150,2,16]", 2, 2, 16, sparse, sparse},
      {"S>T: q 70 at the end of k 200 [2,70,1,16]", 2, 1, 16, iota(70, 130), iota(200)},
      // Key tiles of 64 and 48 columns, head dims a multiple of 32 and of 16 only.
      {"two blockings, Dh 64 [1,112,2,64]", 1, 2, 64, iota(112), iota(112)},
      {"two blockings, Dh 48 [2,112,2,48]", 2, 2, 48, iota(112), iota(112)},
      {"S>T: q 70 at 153 of k 223 [1,70,2,32]", 1, 2, 32, iota(70, 153), iota(223)},
      {"keys past every query get zero grads [1,40,2,16]x[1,150,2,16]", 1, 2, 16, iota(40),
       iota(150)},
      {"odd q pos between even k pos [1,70,3,8]x[1,140,3,8]", 1, 3, 8, iota(70, 1, 2),
       iota(140, 0, 2)},
  };
  Rng rng(12);
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const int64_t T = c.qp.size(), S = c.kp.size();
      Tensor q = randn({c.B, T, c.H, c.D}, rng).set_requires_grad(true);
      Tensor k = randn({c.B, S, c.H, c.D}, rng).set_requires_grad(true);
      Tensor v = randn({c.B, S, c.H, c.D}, rng).set_requires_grad(true);
      Tensor dout = randn({c.B, T, c.H, c.D}, rng);
      const Reference want = naive_attention(q, k, v, repeat(c.B, c.qp), repeat(c.B, c.kp), dout);
      attention(q, k, v, pos_rows(c.B, c.qp), pos_rows(c.B, c.kp, DType::I32)).backward(dout);
      check_close(q.grad(), want.dq, 1e-4);
      check_close(k.grad(), want.dk, 1e-4);
      check_close(v.grad(), want.dv, 1e-4);
    }
  }
}

TEST_CASE(
    "MoD property: attention over gathered rows with their original positions equals "
    "full causal attention restricted to those rows",
    "[forward]") {
  const int64_t B = 2, T = 200, H = 2, D = 16, C = 77;
  Rng rng(13);
  Tensor q = randn({B, T, H, D}, rng), k = randn({B, T, H, D}, rng), v = randn({B, T, H, D}, rng);
  // A different sorted random subset per batch row, as the router's top-C would pick.
  std::vector<int64_t> idx;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<bool> chosen(T, false);
    for (int64_t n = 0; n < C;) {
      const int64_t t = rng.below(T);
      if (!chosen[t]) chosen[t] = true, ++n;
    }
    for (int64_t t = 0; t < T; ++t)
      if (chosen[t]) idx.push_back(t);
  }
  auto gather = [&](const Tensor& x) {
    Tensor g = Tensor::empty({B, C, H, D});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t e = 0; e < H * D; ++e)
          g.set((b * C + c) * H * D + e, x.at((b * T + idx[b * C + c]) * H * D + e));
    return g;
  };
  Tensor pos = Tensor::from_indices(idx, {B, C});
  Tensor got = attention(gather(q), gather(k), gather(v), pos);

  // Reference on the full tensors: query idx[i] attends keys idx[j] <= idx[i] only.
  std::vector<double> want(B * C * H * D, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < C; ++i) {
        const int64_t ti = idx[b * C + i];
        std::vector<double> w;
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < C && idx[b * C + j] <= ti; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += q.at(((b * T + ti) * H + h) * D + d) *
                   k.at(((b * T + idx[b * C + j]) * H + h) * D + d);
          w.push_back(dot / std::sqrt(double(D)));
          mx = std::max(mx, w.back());
        }
        for (double& x : w) sum += x = std::exp(x - mx);
        for (size_t j = 0; j < w.size(); ++j)
          for (int64_t d = 0; d < D; ++d)
            want[((b * C + i) * H + h) * D + d] +=
                w[j] / sum * v.at(((b * T + idx[b * C + j]) * H + h) * D + d);
      }
  check_close(got, want, 2e-5);
  // Only the order of positions matters: relabelling them 0..C-1 gives the same result.
  check_close(attention(gather(q), gather(k), gather(v), pos_rows(B, iota(C))), got.to_vector(),
              1e-6);
}

// The backend contract for a query that sees no key (core/backend.h): the op rejects such CPU
// positions, so the kernels are called directly. Tiles of 64 queries where some, all or none see
// a key; the queries that see one must be untouched by their blind neighbours.
TEST_CASE("attention: a query that sees no key gets out 0, lse -inf and no gradient",
          "[forward][backward]") {
  const std::vector<AttnCase> cases = {
      {"queries 0..2 of 70 before the first key", 1, 2, 16, iota(70), iota(70, 3)},
      {"queries 0..65 of 70 before the first key (a whole tile blind)", 1, 2, 16, iota(70),
       iota(70, 66)},
      {"every query before the first key", 1, 2, 8, iota(20), iota(30, 100)},
      {"no key at all (S = 0)", 2, 2, 8, iota(9), {}},
  };
  Rng rng(16);
  Backend& cpu = backend(Device::CPU);
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const int64_t T = c.qp.size(), S = c.kp.size();
      Tensor q = randn({c.B, T, c.H, c.D}, rng), k = randn({c.B, S, c.H, c.D}, rng),
             v = randn({c.B, S, c.H, c.D}, rng), dout = randn({c.B, T, c.H, c.D}, rng);
      const Reference want = naive_attention(q, k, v, repeat(c.B, c.qp), repeat(c.B, c.kp), dout);
      const Tensor qp = pos_rows(c.B, c.qp), kp = pos_rows(c.B, c.kp, DType::I32);
      Tensor out = Tensor::empty(q.shape()), lse = Tensor::empty({c.B, c.H, T});
      cpu.attention_forward(q, k, v, qp, kp, out, lse);
      check_close(out, want.out, 2e-5);
      check_close(lse, want.lse, 2e-5);
      Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
             dv = Tensor::empty(v.shape());
      cpu.attention_backward(q, k, v, qp, kp, out, lse, dout, dq, dk, dv);
      check_close(dq, want.dq, 1e-4);
      check_close(dk, want.dk, 1e-4);
      check_close(dv, want.dv, 1e-4);
    }
  }
}

namespace {
std::vector<double> naive_rope(const Tensor& x, const std::vector<int64_t>& pos, double theta,
                               double sign = 1.0) {
  const int64_t N = x.size(0) * x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  std::vector<double> y(x.numel());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a = sign * pos[t] * std::pow(theta, -2.0 * i / D);
        const int64_t o = (t * H + h) * D;
        const double x1 = x.at(o + i), x2 = x.at(o + i + half);
        y[o + i] = x1 * std::cos(a) - x2 * std::sin(a);
        y[o + i + half] = x1 * std::sin(a) + x2 * std::cos(a);
      }
  return y;
}
}  // namespace

TEST_CASE("rope matches a naive rotation by explicit positions, inverse undoes it", "[forward]") {
  Rng rng(14);
  SECTION("small [2,7,3,10], unsorted positions up to 10^9, i64") {
    // 2*10^6 and 10^9 exceed the vectorised sincos range and take libm's.
    const std::vector<int64_t> row = {0, 3, 4, 100, 2000000, 5, 1000000000};
    Tensor x = randn({2, 7, 3, 10}, rng);
    for (double theta : {10000.0, 500.0})
      check_close(rope(x, pos_rows(2, row), theta), naive_rope(x, repeat(2, row), theta), 1e-5);
  }
  SECTION("parallel [2,100,4,64], random positions up to 10^6, i32; backward = inverse") {
    std::vector<int64_t> p(200);
    for (auto& e : p) e = rng.below(1000000);
    Tensor pos = Tensor::from_indices(p, {2, 100}, DType::I32);
    Tensor x = randn({2, 100, 4, 64}, rng).set_requires_grad(true);
    Tensor y = rope(x, pos);
    check_close(y, naive_rope(x, p, 10000.0), 1e-5);
    Tensor back = Tensor::empty(x.shape());
    backend(Device::CPU).rope(y, pos, 10000.0, /*inverse=*/true, back);
    check_close(back, x.to_vector(), 1e-5);
    Tensor g = randn(x.shape(), rng);
    y.backward(g);
    check_close(x.grad(), naive_rope(g, p, 10000.0, -1.0), 1e-5);
  }
}

TEST_CASE("attention and rope reject bad arguments with messages naming them", "[errors]") {
  Rng rng(15);
  Tensor q = randn({2, 5, 2, 8}, rng), k = randn({2, 6, 2, 8}, rng), v = randn({2, 6, 2, 8}, rng);
  Tensor qp = pos_rows(2, iota(5, 1)), kp = pos_rows(2, iota(6));
  CHECK_NOTHROW(attention(q, k, v, qp, kp));
  auto fails = [&](auto&& f, const std::string& a, const std::string& b) {
    CHECK_THROWS_WITH(f(), Contains("attention") && Contains(a) && Contains(b));
  };
  fails([&] { return attention(randn({2, 5, 16}, rng), k, v, qp, kp); }, "q", "[2, 5, 16]");
  Tensor k3 = randn({2, 6, 3, 8}, rng);
  fails([&] { return attention(q, k3, k3, qp, kp); }, "[2, 6, 3, 8]", "[2, 5, 2, 8]");
  fails([&] { return attention(q, k, randn({2, 7, 2, 8}, rng), qp, kp); }, "v", "[2, 7, 2, 8]");
  fails([&] { return attention(q, randn({2, 6, 2, 8}, rng, DType::F64), v, qp, kp); }, "k", "f64");
  fails([&] { return attention(q, k, v, pos_rows(2, iota(4)), kp); }, "q_pos", "[2, 4]");
  fails([&] { return attention(q, k, v, qp, Tensor::zeros({2, 6})); }, "k_pos", "f32");
  fails(
      [&] {
        return attention(q, k, v, qp, pos_rows(2, {0, 1, 2, 2, 4, 5}));
      },
      "k_pos row 0 is not strictly increasing", "k_pos[0, 3] = 2");
  Tensor bad_row = Tensor::from_indices({1, 2, 3, 4, 5, 1, 2, 5, 4, 6}, {2, 5});
  fails([&] { return attention(q, k, v, bad_row, kp); }, "q_pos row 1", "q_pos[1, 3] = 4");
  fails([&] { return attention(q, k, v, qp, pos_rows(2, iota(6, 2))); }, "q_pos[0, 0] = 1",
        "sees no key");
  fails(
      [&] {
        return attention(q, randn({2, 0, 2, 8}, rng), randn({2, 0, 2, 8}, rng), qp,
                         pos_rows(2, {}));
      },
      "sees no key", "[2, 0, 2, 8]");

  Tensor x = randn({2, 5, 2, 8}, rng);
  auto rope_fails = [&](auto&& f, const std::string& a, const std::string& b) {
    CHECK_THROWS_WITH(f(), Contains("rope") && Contains(a) && Contains(b));
  };
  rope_fails([&] { return rope(randn({2, 5, 8}, rng), qp); }, "x", "[2, 5, 8]");
  rope_fails([&] { return rope(randn({2, 5, 2, 7}, rng), qp); }, "even", "[2, 5, 2, 7]");
  rope_fails([&] { return rope(x, pos_rows(2, iota(4))); }, "pos", "[2, 4]");
  rope_fails([&] { return rope(x, Tensor::zeros({2, 5})); }, "pos", "f32");
  rope_fails([&] { return rope(x, pos_rows(2, {0, -3, 1, 2, 3})); }, "pos[0, 1]", "-3");
  rope_fails([&] { return rope(x, qp, 0.0); }, "theta", "positive");
}
