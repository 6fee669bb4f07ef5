// Gradient cases for the norms (alone and fused with the residual add before them),
// activations, softmax, logsumexp and cross-entropy. Widths are
// deliberately not multiples of the SIMD width; logsumexp covers a 1-D input (scalar output);
// cross-entropy covers ignored targets, a 3-D logits tensor, i32 targets and a non-default
// ignore_index.
#include "core/all_ops.h"
#include "tests/support/grad_check.h"

namespace mod::test {
namespace {

Tensor leaf(const Shape& s, Rng& rng, double std = 1.0) {
  return randn(s, rng, DType::F64, std).set_requires_grad(true);
}

// Targets in [0, v), with each position listed in `ignored` set to ignore_index.
Tensor targets(const Shape& s, int64_t v, Rng& rng, std::vector<int64_t> ignored = {},
               int64_t ignore_index = -100, DType dtype = DType::I64) {
  std::vector<int64_t> t(static_cast<size_t>(shape_numel(s)));
  for (auto& x : t) x = rng.below(v);
  for (int64_t i : ignored) t[static_cast<size_t>(i)] = ignore_index;
  return Tensor::from_indices(t, s, dtype);
}

GradCase rmsnorm_case(const char* name, Shape x) {
  return {name, Op::RMSNorm,
          [=](Rng& rng) {
            // weight around 1 like a trained gain, but not exactly 1 so its role is visible
            return std::vector<Tensor>{leaf(x, rng), leaf({x.back()}, rng, 0.5)};
          },
          [](const std::vector<Tensor>& in) { return rmsnorm(in[0], in[1]); }};
}

GradCase layernorm_case(const char* name, Shape x) {
  return {
      name, Op::LayerNorm,
      [=](Rng& rng) {
        return std::vector<Tensor>{leaf(x, rng, 2.0), leaf({x.back()}, rng), leaf({x.back()}, rng)};
      },
      [](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2]); }};
}

// Which outputs of the fused add + norm reach the checked sum: both (the sum weighted by a fixed
// random m, so its gradient differs from the norm's), the norm only, or the sum only.
enum class AddNormUses { Both, NormedOnly, SumOnly };

Tensor add_norm_forward(const AddNorm& o, const Tensor& m, AddNormUses uses) {
  switch (uses) {
    case AddNormUses::NormedOnly: return o.normed;
    case AddNormUses::SumOnly: return o.sum;
    case AddNormUses::Both: break;
  }
  return add(mul(o.sum, m), o.normed);
}

// inputs: x, a (both require grad), weight (, bias), then m (no grad).
GradCase add_norm_case(const char* name, bool layer, Shape x, AddNormUses uses) {
  return {name, layer ? Op::AddLayerNorm : Op::AddRMSNorm,
          [=](Rng& rng) {
            std::vector<Tensor> in{leaf(x, rng, 1.5), leaf(x, rng), leaf({x.back()}, rng, 0.5)};
            if (layer) in.push_back(leaf({x.back()}, rng));
            in.push_back(randn(x, rng, DType::F64));
            return in;
          },
          [=](const std::vector<Tensor>& in) {
            return layer ? add_norm_forward(add_layernorm(in[0], in[1], in[2], in[3]), in[4], uses)
                         : add_norm_forward(add_rmsnorm(in[0], in[1], in[2]), in[3], uses);
          }};
}

GradCase unary_case(const char* name, Op op, Shape x, double std, Tensor (*f)(const Tensor&)) {
  return {name, op, [=](Rng& rng) { return std::vector<Tensor>{leaf(x, rng, std)}; },
          [=](const std::vector<Tensor>& in) { return f(in[0]); }};
}

GradCase swiglu_case(const char* name, Shape x) {
  return {name, Op::SwiGLU,
          [=](Rng& rng) {
            return std::vector<Tensor>{leaf(x, rng, 2.0), leaf(x, rng)};
          },
          [](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }};
}

GradCase cross_entropy_case(const char* name, Shape logits, std::vector<int64_t> ignored = {},
                            int64_t ignore_index = -100, DType dtype = DType::I64) {
  return {name, Op::CrossEntropy,
          [=](Rng& rng) {
            Shape lead(logits.begin(), logits.end() - 1);
            Tensor x = leaf(logits, rng, 2.0);
            return std::vector<Tensor>{
                x, targets(lead, logits.back(), rng, ignored, ignore_index, dtype)};
          },
          [=](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], ignore_index); }};
}

const bool registered = register_grad_cases({
    rmsnorm_case("rmsnorm [3,17]", {3, 17}),
    rmsnorm_case("rmsnorm [2,3,13]", {2, 3, 13}),
    rmsnorm_case("rmsnorm [4,33]", {4, 33}),
    layernorm_case("layernorm [3,17]", {3, 17}),
    layernorm_case("layernorm [2,3,13]", {2, 3, 13}),
    layernorm_case("layernorm [2,33]", {2, 33}),
    add_norm_case("add_rmsnorm [3,17] both outputs", false, {3, 17}, AddNormUses::Both),
    add_norm_case("add_rmsnorm [2,3,13] normed only", false, {2, 3, 13}, AddNormUses::NormedOnly),
    add_norm_case("add_rmsnorm [4,9] sum only", false, {4, 9}, AddNormUses::SumOnly),
    add_norm_case("add_layernorm [3,17] both outputs", true, {3, 17}, AddNormUses::Both),
    add_norm_case("add_layernorm [2,3,13] normed only", true, {2, 3, 13}, AddNormUses::NormedOnly),
    add_norm_case("add_layernorm [4,9] sum only", true, {4, 9}, AddNormUses::SumOnly),
    unary_case("gelu [3,17]", Op::GELU, {3, 17}, 1.0, gelu),
    unary_case("gelu [2,3,13] wide inputs (saturated tails)", Op::GELU, {2, 3, 13}, 5.0, gelu),
    unary_case("silu [3,17]", Op::SiLU, {3, 17}, 1.0, silu),
    unary_case("sigmoid [3,17]", Op::Sigmoid, {3, 17}, 2.0, sigmoid),
    unary_case("silu [2,33] wide inputs (saturated tails)", Op::SiLU, {2, 33}, 6.0, silu),
    swiglu_case("swiglu [3,17]", {3, 17}),
    swiglu_case("swiglu [2,3,13]", {2, 3, 13}),
    unary_case("softmax [3,17]", Op::Softmax, {3, 17}, 2.0, softmax),
    unary_case("softmax [2,3,13]", Op::Softmax, {2, 3, 13}, 2.0, softmax),
    unary_case("softmax [33]", Op::Softmax, {33}, 1.0, softmax),
    unary_case("logsumexp [3,17]", Op::LogSumExp, {3, 17}, 2.0, logsumexp),
    unary_case("logsumexp [2,3,13]", Op::LogSumExp, {2, 3, 13}, 2.0, logsumexp),
    unary_case("logsumexp [33] to a scalar", Op::LogSumExp, {33}, 1.0, logsumexp),
    unary_case("logsumexp [4,1] (single logit: identity)", Op::LogSumExp, {4, 1}, 1.0, logsumexp),
    cross_entropy_case("cross_entropy [5,17]", {5, 17}),
    cross_entropy_case("cross_entropy [6,13] with 2 ignored targets", {6, 13}, {1, 4}),
    cross_entropy_case("cross_entropy 3-D logits [2,3,11]", {2, 3, 11}, {2}),
    cross_entropy_case("cross_entropy [4,33] i32 targets, ignore_index 0", {4, 33}, {3}, 0,
                       DType::I32),
    cross_entropy_case("cross_entropy [3,7] every target ignored (zero loss)", {3, 7}, {0, 1, 2}),
});

}  // namespace
}  // namespace mod::test
