// Gradient cases for matmul, the fused GELU MLP, elementwise arithmetic and reductions. Sizes are deliberately not
// multiples of the SIMD width.
#include "core/all_ops.h"
#include "tests/support/grad_check.h"

namespace mod::test {
namespace {

Tensor leaf(const Shape& s, Rng& rng) { return randn(s, rng, DType::F64).set_requires_grad(true); }

GradCase matmul_case(const char* name, Shape a, Shape b, bool ta, bool tb) {
  return {name, Op::MatMul,
          [=](Rng& rng) { return std::vector<Tensor>{leaf(a, rng), leaf(b, rng)}; },
          [=](const std::vector<Tensor>& in) { return matmul(in[0], in[1], ta, tb); }};
}

GradCase binary_case(const char* name, Op op, Shape a, Shape b,
                     Tensor (*f)(const Tensor&, const Tensor&)) {
  return {name, op, [=](Rng& rng) { return std::vector<Tensor>{leaf(a, rng), leaf(b, rng)}; },
          [=](const std::vector<Tensor>& in) { return f(in[0], in[1]); }};
}

// x [.., D], w_up [F, D], w_down [D, F]: pre-activations of a few units of spread, so GELU's
// curved part (where its derivative is not 0 or 1) carries the check.
GradCase gelu_mlp_case(const char* name, Shape x, int64_t f) {
  const int64_t d = x.back();
  return {name, Op::GeluMlp,
          [=](Rng& rng) {
            return std::vector<Tensor>{leaf(x, rng), leaf({f, d}, rng), leaf({d, f}, rng)};
          },
          [](const std::vector<Tensor>& in) { return gelu_mlp(in[0], in[1], in[2]); }};
}

const bool registered = register_grad_cases({
    gelu_mlp_case("gelu_mlp [2,3,5] F 7", {2, 3, 5}, 7),
    gelu_mlp_case("gelu_mlp one row [1,9] F 4", {1, 9}, 4),
    {"row_scores [2,3,7] . [1,7]", Op::RowScores,
     [](Rng& rng) { return std::vector<Tensor>{leaf({2, 3, 7}, rng), leaf({1, 7}, rng)}; },
     [](const std::vector<Tensor>& in) { return row_scores(in[0], in[1]); }},
    matmul_case("matmul nn [5,7]x[7,3]", {5, 7}, {7, 3}, false, false),
    matmul_case("matmul nt [5,7]x[3,7]^T", {5, 7}, {3, 7}, false, true),
    matmul_case("matmul tn [7,5]^Tx[7,3]", {7, 5}, {7, 3}, true, false),
    matmul_case("matmul tt [7,5]^Tx[3,7]^T", {7, 5}, {3, 7}, true, true),
    matmul_case("matmul linear [2,3,9]x[4,9]^T", {2, 3, 9}, {4, 9}, false, true),
    matmul_case("matmul one row [1,9]x[4,9]^T (GEMV)", {1, 9}, {4, 9}, false, true),
    matmul_case("matmul one column tn [7,5]^Tx[7,1] (GEMV)", {7, 5}, {7, 1}, true, false),
    matmul_case("matmul batched [3,4,5]x[3,5,6]", {3, 4, 5}, {3, 5, 6}, false, false),
    matmul_case("matmul batched tt [2,5,4]^Tx[2,3,5]^T", {2, 5, 4}, {2, 3, 5}, true, true),
    binary_case("add same [3,17]", Op::Add, {3, 17}, {3, 17}, add),
    binary_case("add suffix [2,3,17]+[17]", Op::Add, {2, 3, 17}, {17}, add),
    binary_case("add row [2,3,17]+[2,3,1]", Op::Add, {2, 3, 17}, {2, 3, 1}, add),
    binary_case("sub suffix [4,5,9]-[5,9]", Op::Sub, {4, 5, 9}, {5, 9}, sub),
    binary_case("sub same [19]", Op::Sub, {19}, {19}, sub),
    binary_case("mul same [3,17]", Op::Mul, {3, 17}, {3, 17}, mul),
    binary_case("mul suffix [4,11]*[11]", Op::Mul, {4, 11}, {11}, mul),
    binary_case("mul row [2,5,7]*[2,5,1] (router scale)", Op::Mul, {2, 5, 7}, {2, 5, 1}, mul),
    binary_case("bias_add [2,3,13]+[13]", Op::BiasAdd, {2, 3, 13}, {13}, bias_add),
    {"scale [3,7] by -1.7", Op::Scale,
     [](Rng& rng) { return std::vector<Tensor>{leaf({3, 7}, rng)}; },
     [](const std::vector<Tensor>& in) { return scale(in[0], -1.7); }},
    {"reshape [2,3,5]->[6,5] then mul", Op::Reshape,
     [](Rng& rng) { return std::vector<Tensor>{leaf({2, 3, 5}, rng), leaf({6, 5}, rng)}; },
     [](const std::vector<Tensor>& in) { return mul(reshape(in[0], {6, 5}), in[1]); }},
    // f64 -> f64 keeps finite differences exact; the narrowing casts are checked exactly in
    // tests/model/autocast_test.cpp.
    {"cast [3,5] f64 -> f64 then mul", Op::Cast,
     [](Rng& rng) { return std::vector<Tensor>{leaf({3, 5}, rng), leaf({3, 5}, rng)}; },
     [](const std::vector<Tensor>& in) { return mul(cast(in[0], DType::F64), in[1]); }},
    {"sum [4,9] of squares", Op::Sum,
     [](Rng& rng) { return std::vector<Tensor>{leaf({4, 9}, rng)}; },
     [](const std::vector<Tensor>& in) { return sum(mul(in[0], in[0])); }},
    {"mean [3,5,7]", Op::Mean, [](Rng& rng) { return std::vector<Tensor>{leaf({3, 5, 7}, rng)}; },
     [](const std::vector<Tensor>& in) { return mean(in[0]); }},
});

}  // namespace
}  // namespace mod::test
