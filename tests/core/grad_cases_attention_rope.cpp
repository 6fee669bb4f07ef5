// Gradient cases for rope and the fused causal attention: contiguous and gathered (non-
// contiguous) positions, a query block at the end of a longer key sequence, and sequences
// longer than one 64-row tile so the tiled backward crosses tile and causal boundaries, and
// than one 256-key chunk so the forward's online softmax rescales.
#include "core/all_ops.h"
#include "tests/support/grad_check.h"

namespace mod::test {
namespace {

Tensor leaf(const Shape& s, Rng& rng) {
  return randn(s, rng, DType::F64).set_requires_grad(true);
}

// [B, n] positions, the same row for every batch entry.
Tensor rows(int64_t batch, const std::vector<int64_t>& row, DType dtype = DType::I64) {
  std::vector<int64_t> all;
  for (int64_t b = 0; b < batch; ++b) all.insert(all.end(), row.begin(), row.end());
  return Tensor::from_indices(all, {batch, static_cast<int64_t>(row.size())}, dtype);
}

std::vector<int64_t> iota(int64_t n, int64_t start = 0, int64_t step = 1) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + i * step;
  return v;
}

GradCase rope_case(const char* name, Shape x, std::vector<int64_t> pos, double theta,
                   DType pos_dtype = DType::I64) {
  return {name, Op::Rope, [=](Rng& rng) { return std::vector<Tensor>{leaf(x, rng)}; },
          [=](const std::vector<Tensor>& in) {
            return rope(in[0], rows(x[0], pos, pos_dtype), theta);
          }};
}

// q [B,T,H,Dh] with q_pos (T entries), k,v [B,S,H,Dh] with k_pos (S entries).
GradCase attention_case(const char* name, int64_t B, int64_t H, int64_t Dh,
                        std::vector<int64_t> q_pos, std::vector<int64_t> k_pos) {
  const int64_t T = static_cast<int64_t>(q_pos.size()), S = static_cast<int64_t>(k_pos.size());
  return {name, Op::Attention,
          [=](Rng& rng) {
            return std::vector<Tensor>{leaf({B, T, H, Dh}, rng), leaf({B, S, H, Dh}, rng),
                                       leaf({B, S, H, Dh}, rng)};
          },
          [=](const std::vector<Tensor>& in) {
            return attention(in[0], in[1], in[2], rows(B, q_pos), rows(B, k_pos));
          }};
}

const bool registered = register_grad_cases({
    rope_case("rope [2,5,2,4] pos 0..4", {2, 5, 2, 4}, iota(5), 10000.0),
    rope_case("rope [1,3,3,6] pos {1,4,9} theta 100", {1, 3, 3, 6}, {1, 4, 9}, 100.0),
    rope_case("rope [2,4,1,14] i32 pos {7,0,300,12}", {2, 4, 1, 14}, {7, 0, 300, 12}, 10000.0,
              DType::I32),
    attention_case("attention self [2,5,2,4] pos 0..4", 2, 2, 4, iota(5), iota(5)),
    attention_case("attention gathered [2,5,2,4] pos {1,4,5,9,12}", 2, 2, 4, {1, 4, 5, 9, 12},
                   {1, 4, 5, 9, 12}),
    attention_case("attention S>T q [2,3,2,4] pos 4..6 on k [2,7,2,4] pos 0..6", 2, 2, 4,
                   iota(3, 4), iota(7)),
    attention_case("attention q pos {3,8,9} between k pos {0,2,..,18} [1,3,1,5]x[1,10,1,5]", 1, 1,
                   5, {3, 8, 9}, iota(10, 0, 2)),
    attention_case("attention 3 tiles [1,130,1,2] pos 0..129", 1, 1, 2, iota(130), iota(130)),
    attention_case("attention tiles, gathered [2,70,2,2] pos 0,3,6,..", 2, 2, 2, iota(70, 0, 3),
                   iota(70, 0, 3)),
    attention_case("attention S>T across tiles q [1,40,1,2] pos 60..99 on k [1,100,1,2]", 1, 1, 2,
                   iota(40, 60), iota(100)),
    attention_case("attention 2 key chunks (online rescale) [1,270,1,1]", 1, 1, 1, iota(270),
                   iota(270)),
});

}  // namespace
}  // namespace mod::test
