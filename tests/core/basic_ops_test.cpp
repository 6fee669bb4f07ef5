// Forward of matmul, elementwise and reductions against naive float32 references, and their
// argument errors.
#include <catch2/catch.hpp>

#include "core/all_ops.h"
#include "core/backend.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
// Naive C = op(A) op(B) for one [M,K]x[K,N] slice, in double.
std::vector<double> naive_matmul(const Tensor& a, const Tensor& b, int64_t batch, bool ta,
                                 bool tb) {
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  const int64_t m = ta ? ac : ar, k = ta ? ar : ac, n = tb ? br : bc;
  std::vector<double> c(static_cast<size_t>(batch * m * n), 0.0);
  const bool b_batched = b.dim() == 3;
  for (int64_t t = 0; t < batch; ++t)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = a.at(t * ar * ac + (ta ? p * ac + i : i * ac + p));
          const double bv = b.at((b_batched ? t * br * bc : 0) + (tb ? j * bc + p : p * bc + j));
          s += av * bv;
        }
        c[static_cast<size_t>((t * m + i) * n + j)] = s;
      }
  return c;
}

void check_close(const Tensor& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.numel() == static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.numel(); ++i) {
    INFO("element " << i);
    CHECK(got.at(i) == Approx(want[static_cast<size_t>(i)]).margin(tol).epsilon(tol));
  }
}
}  // namespace

TEST_CASE("matmul forward matches a naive reference in f32", "[forward]") {
  Rng rng(7);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      DYNAMIC_SECTION("2-D ta=" << ta << " tb=" << tb) {
        Tensor a = randn(ta ? Shape{33, 17} : Shape{17, 33}, rng);
        Tensor b = randn(tb ? Shape{9, 33} : Shape{33, 9}, rng);
        Tensor c = matmul(a, b, ta, tb);
        CHECK(c.shape() == Shape{17, 9});
        check_close(c, naive_matmul(a, b, 1, ta, tb), 1e-4);
      }
      DYNAMIC_SECTION("batched ta=" << ta << " tb=" << tb) {
        Tensor a = randn(ta ? Shape{3, 13, 5} : Shape{3, 5, 13}, rng);
        Tensor b = randn(tb ? Shape{3, 7, 13} : Shape{3, 13, 7}, rng);
        Tensor c = matmul(a, b, ta, tb);
        CHECK(c.shape() == Shape{3, 5, 7});
        check_close(c, naive_matmul(a, b, 3, ta, tb), 1e-4);
      }
    }
  SECTION("one row and one column (the GEMV path), every transpose") {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (auto [m, n] : {std::pair<int64_t, int64_t>{1, 9}, {17, 1}, {1, 1}}) {
          INFO("m=" << m << " n=" << n << " ta=" << ta << " tb=" << tb);
          Tensor a = randn(ta ? Shape{33, m} : Shape{m, 33}, rng);
          Tensor b = randn(tb ? Shape{n, 33} : Shape{33, n}, rng);
          check_close(matmul(a, b, ta, tb), naive_matmul(a, b, 1, ta, tb), 1e-4);
          Tensor a3 = randn(ta ? Shape{2, 33, m} : Shape{2, m, 33}, rng);
          Tensor b3 = randn(tb ? Shape{2, n, 33} : Shape{2, 33, n}, rng);
          check_close(matmul(a3, b3, ta, tb), naive_matmul(a3, b3, 2, ta, tb), 1e-4);
        }
  }
  SECTION("linear layer [2,3,19] x [5,19]^T") {
    Tensor x = randn({2, 3, 19}, rng), w = randn({5, 19}, rng);
    Tensor y = linear(x, w);
    CHECK(y.shape() == Shape{2, 3, 5});
    check_close(y, naive_matmul(x.view({6, 19}), w, 1, false, true), 1e-4);
  }
  SECTION("a GEMM large enough for BLAS threading [300,200]x[200,100]") {
    Tensor a = randn({300, 200}, rng), b = randn({200, 100}, rng);
    check_close(matmul(a, b), naive_matmul(a, b, 1, false, false), 1e-3);
  }
}

TEST_CASE("elementwise forward with broadcasting matches a naive reference", "[forward]") {
  Rng rng(3);
  Tensor a = randn({2, 3, 17}, rng);
  Tensor same = randn({2, 3, 17}, rng), suffix = randn({17}, rng), row = randn({2, 3, 1}, rng);
  std::vector<double> want_add(a.numel()), want_sub(a.numel()), want_mul(a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) {
    want_add[i] = a.at(i) + same.at(i);
    want_sub[i] = a.at(i) - suffix.at(i % 17);
    want_mul[i] = a.at(i) * row.at(i / 17);
  }
  check_close(add(a, same), want_add, 1e-6);
  check_close(sub(a, suffix), want_sub, 1e-6);
  check_close(mul(a, row), want_mul, 1e-6);
  check_close(bias_add(a, suffix), [&] {
    std::vector<double> w(a.numel());
    for (int64_t i = 0; i < a.numel(); ++i) w[i] = a.at(i) + suffix.at(i % 17);
    return w;
  }(), 1e-6);
  std::vector<double> want_scale(a.numel());
  for (int64_t i = 0; i < a.numel(); ++i) want_scale[i] = 2.5 * a.at(i);
  check_close(scale(a, 2.5), want_scale, 1e-6);
}

TEST_CASE("sum and mean match a naive reference, also past the parallel threshold",
          "[forward]") {
  Rng rng(5);
  for (int64_t n : {1, 7, 100003}) {
    Tensor x = randn({n}, rng);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += x.at(i);
    CHECK(sum(x).item() == Approx(s).margin(1e-3));
    CHECK(mean(x).item() == Approx(s / n).margin(1e-6));
  }
}

// The gradient norm's pass: the sum of squares, accumulated in double, in the input's dtype.
TEST_CASE("sum_squares matches a naive double reference, also past the parallel threshold",
          "[forward]") {
  Rng rng(6);
  for (const DType dtype : {DType::F32, DType::F64})
    for (int64_t n : {0, 1, 7, 100003}) {
      INFO(dtype_name(dtype) << ", " << n << " elements");
      Tensor x = randn({n}, rng, dtype), out = Tensor::empty({1}, dtype);
      double want = 0;
      for (int64_t i = 0; i < n; ++i) want += x.at(i) * x.at(i);
      backend(Device::CPU).sum_squares(x, out);
      CHECK(out.at(0) == Approx(want).epsilon(dtype == DType::F32 ? 1e-6 : 1e-12));
    }
}

TEST_CASE("basic ops reject bad shapes and dtypes with messages naming them", "[errors]") {
  Rng rng(1);
  Tensor a = randn({4, 5}, rng), b = randn({6, 3}, rng);
  CHECK_THROWS_WITH(matmul(a, b), Contains("matmul") && Contains("[4, 5]") && Contains("[6, 3]"));
  CHECK_THROWS_WITH(add(a, randn({3}, rng)), Contains("add") && Contains("[3]"));
  CHECK_THROWS_WITH(mul(a, randn({4, 5}, rng, DType::F64)), Contains("mul") && Contains("f64"));
  CHECK_THROWS_WITH(bias_add(a, randn({4}, rng)), Contains("bias_add") && Contains("[4]"));
  CHECK_THROWS_WITH(reshape(a, {3, 7}), Contains("reshape") && Contains("[3, 7]"));
  CHECK_THROWS_WITH(sum(Tensor::zeros({3}, DType::I64)), Contains("sum") && Contains("i64"));
}

TEST_CASE("copy_rows copies a strided block of rows and leaves the rest alone", "[forward]") {
  Tensor src = Tensor::empty({4, 6}, DType::F32), dst = Tensor::empty({5, 4}, DType::F32);
  for (int64_t i = 0; i < src.numel(); ++i) src.set(i, i);
  for (int64_t i = 0; i < dst.numel(); ++i) dst.set(i, -1);
  // rows 1..3 of src, columns 2..4, into rows 1..3 of dst at column 1.
  const size_t es = sizeof(float);
  backend(Device::CPU).copy_rows(src, (6 + 2) * es, 6 * es, dst, (4 + 1) * es, 4 * es, 3, 3 * es);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 4; ++c) {
      const bool copied = r >= 1 && r <= 3 && c >= 1;
      INFO("dst(" << r << ", " << c << ")");
      CHECK(dst.at(r * 4 + c) == (copied ? double(r * 6 + c + 1) : -1.0));
    }
}

// to_vector reads every dtype, integers and bf16 included (a conversion through the CPU's
// float kernels once refused i64, which the GPU parity tests and NCCL's i64 sums read back).
TEST_CASE("to_vector widens every dtype to double", "[tensor]") {
  const std::vector<double> v = {-3, 0, 7, 1.5e6};
  for (DType t : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16}) {
    INFO(dtype_name(t));
    const Tensor x = Tensor::from_vector(v, {2, 2}, t);
    std::vector<double> want = v;
    if (t == DType::BF16) want[3] = 1499136;  // 1.5e6 to bf16's 8 bits: 1.4296875 * 2^20
    CHECK(x.to_vector() == want);
  }
}
