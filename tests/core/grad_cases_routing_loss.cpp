// Gradient cases for embedding, the routing gather/scatter-add (plain and gated), the BCE routing loss and the
// fused LM head + cross-entropy (chunked, ignored targets, tied to the embedding). Index inputs
// include repeats and unsorted rows, since those are where scatter gradients go wrong.
#include "core/all_ops.h"
#include "tests/support/grad_check.h"

namespace mod::test {
namespace {

Tensor leaf(const Shape& s, Rng& rng) {
  return randn(s, rng, DType::F64).set_requires_grad(true);
}

GradCase embedding_case(const char* name, int64_t vocab, int64_t d, std::vector<int64_t> ids,
                        Shape ids_shape, DType index_dtype) {
  return {name, Op::Embedding,
          [=](Rng& rng) {
            return std::vector<Tensor>{Tensor::from_indices(ids, ids_shape, index_dtype),
                                       leaf({vocab, d}, rng)};
          },
          [](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); }};
}

GradCase gather_case(const char* name, Shape x, std::vector<int64_t> idx, Shape idx_shape) {
  return {name, Op::GatherRows,
          [=](Rng& rng) {
            return std::vector<Tensor>{leaf(x, rng), Tensor::from_indices(idx, idx_shape)};
          },
          [](const std::vector<Tensor>& in) { return gather_rows(in[0], in[1]); }};
}

GradCase scatter_case(const char* name, Shape x, std::vector<int64_t> idx, Shape idx_shape,
                      DType index_dtype = DType::I64) {
  const Shape src = {x[0], idx_shape[1], x[2]};
  return {name, Op::ScatterAddRows,
          [=](Rng& rng) {
            return std::vector<Tensor>{
                leaf(x, rng), Tensor::from_indices(idx, idx_shape, index_dtype), leaf(src, rng)};
          },
          [](const std::vector<Tensor>& in) { return scatter_add_rows(in[0], in[1], in[2]); }};
}

// x, src and the gate all differentiable; repeated rows where `idx` repeats.
GradCase scatter_gated_case(const char* name, Shape x, std::vector<int64_t> idx, Shape idx_shape) {
  const Shape src = {x[0], idx_shape[1], x[2]}, gate = {x[0], idx_shape[1], 1};
  return {name, Op::ScatterGatedRows,
          [=](Rng& rng) {
            return std::vector<Tensor>{leaf(x, rng), Tensor::from_indices(idx, idx_shape),
                                       leaf(src, rng), leaf(gate, rng)};
          },
          [](const std::vector<Tensor>& in) {
            return scatter_gated_rows(in[0], in[1], in[2], in[3]);
          }};
}

// targets fixed (no grad): hard 0/1 labels, or fractional ones in [0, 1].
GradCase bce_case(const char* name, Shape s, bool hard) {
  return {name, Op::BCEWithLogits,
          [=](Rng& rng) {
            Tensor logits = randn(s, rng, DType::F64, 2.0).set_requires_grad(true);
            Tensor targets = rand_uniform(s, rng, DType::F64);
            if (hard)
              for (int64_t i = 0; i < targets.numel(); ++i)
                targets.set(i, targets.at(i) < 0.5 ? 0.0 : 1.0);
            return std::vector<Tensor>{logits, targets};
          },
          [](const std::vector<Tensor>& in) { return bce_with_logits(in[0], in[1]); }};
}

// x [..., D] through weight [V, D] with targets (some ignored), chunk_rows rows at a time; or,
// tied, x = embedding(ids, weight) first, so the weight's gradient sums both uses.
GradCase linear_ce_case(const char* name, Shape x, int64_t v, std::vector<int64_t> ignored,
                        int64_t chunk_rows, bool tied = false, int64_t ignore_index = -100,
                        DType index_dtype = DType::I64) {
  return {name, Op::LinearCrossEntropy,
          [=](Rng& rng) {
            Shape lead(x.begin(), x.end() - 1);
            auto draw = [&] {
              std::vector<int64_t> ids(static_cast<size_t>(shape_numel(lead)));
              for (auto& id : ids) id = rng.below(v);
              return ids;
            };
            std::vector<Tensor> in = {tied ? Tensor::from_indices(draw(), lead) : leaf(x, rng),
                                      leaf({v, x.back()}, rng)};
            std::vector<int64_t> t = draw();
            for (int64_t i : ignored) t[static_cast<size_t>(i)] = ignore_index;
            in.push_back(Tensor::from_indices(t, lead, index_dtype));
            return in;
          },
          [=](const std::vector<Tensor>& in) {
            const Tensor h = tied ? embedding(in[0], in[1]) : in[0];
            return linear_cross_entropy(h, in[1], in[2], ignore_index, chunk_rows);
          }};
}

const bool registered = register_grad_cases({
    linear_ce_case("linear_cross_entropy [5,7] x [11,7], one chunk", {5, 7}, 11, {}, 0),
    linear_ce_case("linear_cross_entropy [2,3,7] x [13,7], chunks of 2, 2 ignored", {2, 3, 7}, 13,
                   {1, 4}, 2),
    linear_ce_case("linear_cross_entropy i32 targets, ignore_index 0, chunks of 4", {9, 5}, 17,
                   {3}, 4, false, 0, DType::I32),
    linear_ce_case("linear_cross_entropy tied to the embedding, chunks of 3", {2, 4, 6}, 9, {5},
                   3, true),
    linear_ce_case("linear_cross_entropy every target ignored (zero loss)", {3, 4}, 5, {0, 1, 2},
                   2),
    embedding_case("embedding [2,5] ids into [7,13] with repeats", 7, 13,
                   {3, 0, 3, 6, 3, 1, 1, 0, 6, 2}, {2, 5}, DType::I64),
    embedding_case("embedding i32 [9] ids into [5,33] with repeats", 5, 33,
                   {4, 4, 0, 2, 4, 1, 0, 2, 2}, {9}, DType::I32),
    gather_case("gather_rows [2,9,13] by [2,5] repeated unsorted", {2, 9, 13},
                {7, 2, 2, 8, 0, 4, 4, 4, 1, 6}, {2, 5}),
    gather_case("gather_rows [3,6,33] by [3,2]", {3, 6, 33}, {5, 0, 1, 3, 2, 2}, {3, 2}),
    scatter_case("scatter_add_rows [2,9,13] by [2,4] repeated", {2, 9, 13},
                 {5, 1, 5, 5, 0, 8, 3, 0}, {2, 4}),
    scatter_case("scatter_add_rows i32 [3,5,17] by [3,3] unsorted", {3, 5, 17},
                 {4, 0, 2, 1, 1, 3, 0, 4, 2}, {3, 3}, DType::I32),
    scatter_gated_case("scatter_gated_rows [2,9,13] by [2,4] repeated", {2, 9, 13},
                       {5, 1, 5, 5, 0, 8, 3, 0}, {2, 4}),
    scatter_gated_case("scatter_gated_rows [1,7,1] by [1,3]", {1, 7, 1}, {6, 0, 3}, {1, 3}),
    bce_case("bce_with_logits [3,17] hard targets", {3, 17}, true),
    bce_case("bce_with_logits [2,5,13] fractional targets", {2, 5, 13}, false),
});

}  // namespace
}  // namespace mod::test
