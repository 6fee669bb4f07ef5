// The tensor-parallel ops (parallel/tp_mappings.h, parallel/vocab_parallel.h) and the gradient
// cases of the expert-parallel pair (parallel/expert_parallel.h; its mpirun tests are in
// expert_ops_test.cpp):
// - at any world size, finite-difference gradient checks in float64 on a group of one, where
//   each collective is the identity and the custom backward rules still run;
// - under mpirun, each op on its tp slice against the single-process op on the whole tensor,
//   forward and backward, and gather_parameter reassembling shards along dim 0 and dim 1;
// - sequence parallelism's ops (the pair and MoD's routed rows) on each rank's positions against
//   the whole-sequence ops, forward and backward, bitwise.
#include <catch2/catch.hpp>
#include <set>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "parallel/expert_parallel.h"
#include "parallel/parallelize.h"
#include "parallel/tp_mappings.h"
#include "parallel/vocab_parallel.h"
#include "parallel/zero3.h"
#include "parallel/world.h"
#include "tests/support/grad_check.h"

using namespace mod;
using namespace mod::parallel;

namespace {
parallel::Communicator& local() {
  static auto c = make_local_communicator("tp");
  return *c;
}
parallel::Communicator& local_ep() {
  static auto c = make_local_communicator("ep");
  return *c;
}

std::vector<test::GradCase> collective_cases() {
  auto ids = [](Rng& rng, int64_t n, int64_t v) {
    std::vector<int64_t> t(n);
    for (auto& x : t) x = rng.below(v);
    return t;
  };
  return {
      {"copy_to_tp [3,5]", Op::CopyToTp,
       [](Rng& r) { return std::vector<Tensor>{randn({3, 5}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return copy_to_tp(in[0], local()); }},
      {"reduce_from_tp [3,5]", Op::ReduceFromTp,
       [](Rng& r) { return std::vector<Tensor>{randn({3, 5}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return reduce_from_tp(in[0], local()); }},
      {"gather_from_tp [2,3,4]", Op::GatherFromTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return gather_from_tp(in[0], local()); }},
      {"scatter_to_tp [2,3,4]", Op::ScatterToTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return scatter_to_tp(in[0], local()); }},
      {"gather_seq_from_tp [2,3,4]", Op::GatherSeqFromTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return gather_seq_from_tp(in[0], local()); }},
      {"reduce_scatter_seq_to_tp [2,3,4]", Op::ReduceScatterSeqToTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return reduce_scatter_seq_to_tp(in[0], local()); }},
      {"gather_seq_whole_from_tp [2,3,4]", Op::GatherSeqWholeFromTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return gather_seq_whole_from_tp(in[0], local()); }},
      {"split_seq_to_tp [2,3,4]", Op::SplitSeqToTp,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return split_seq_to_tp(in[0], local()); }},
      {"expert_dispatch [3,4,2]", Op::ExpertDispatch,
       [](Rng& r) { return std::vector<Tensor>{randn({3, 4, 2}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return dispatch_to_experts(in[0], local_ep(), local()); }},
      {"expert_combine [2,3,4]", Op::ExpertCombine,
       [](Rng& r) { return std::vector<Tensor>{randn({2, 3, 4}, r, DType::F64).set_requires_grad(true)}; },
       [](const std::vector<Tensor>& in) { return combine_from_experts(in[0], local_ep(), local()); }},
      // ZeRO-3's boundary: identity on both; here its before-backward step does nothing.
      {"gather_unit_for_backward [3,5] twice", Op::GatherUnitForBackward,
       [](Rng& r) {
         return std::vector<Tensor>{randn({3, 5}, r, DType::F64).set_requires_grad(true),
                                    randn({3, 5}, r, DType::F64).set_requires_grad(true)};
       },
       [](const std::vector<Tensor>& in) {
         const auto [x, aux] = gather_unit_for_backward(in[0], in[1], [] {});
         return add(x, aux);
       }},
      {"vocab_parallel_cross_entropy [2,3,7] with an ignored target", Op::VocabParallelCrossEntropy,
       [ids](Rng& r) {
         auto t = ids(r, 6, 7);
         t[4] = -100;
         return std::vector<Tensor>{randn({2, 3, 7}, r, DType::F64).set_requires_grad(true),
                                    Tensor::from_indices(t, {2, 3})};
       },
       [](const std::vector<Tensor>& in) {
         return vocab_parallel_cross_entropy(in[0], in[1], 0, local());
       }},
  };
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.at(i) - b.at(i)));
  return m;
}
}  // namespace

TEST_CASE("every collective op has a gradient case, and each matches finite differences", "[mpi]") {
  std::set<Op> covered;
  for (const auto& c : collective_cases()) {
    covered.insert(c.op);
    const test::GradReport r = test::check_gradients(c);
    INFO(c.name << ": worst " << r.worst << " (relative error " << r.worst_error << ")");
    CHECK(r.elements_checked > 0);
    CHECK(r.ok);
  }
  for (size_t i = 0; i < static_cast<size_t>(Op::Count); ++i) {
    const Op op = static_cast<Op>(i);
    INFO("op " << op_name(op));
    if (op_collective(op)) CHECK(covered.count(op) == 1);
  }
}

TEST_CASE("vocabulary-parallel cross-entropy and embedding equal the single-process ops", "[mpi]") {
  auto& tp = world();
  const int64_t v = 12 * tp.size(), rows = 10, d = 5, slice = v / tp.size(), start = tp.rank() * slice;
  Rng rng(11);  // same data on every rank
  Tensor logits = randn({2, rows / 2, v}, rng, DType::F64).set_requires_grad(true);
  std::vector<int64_t> t(rows);
  for (auto& x : t) x = rng.below(v);
  t[3] = -100;
  const Tensor targets = Tensor::from_indices(t, {2, rows / 2});

  Tensor full = cross_entropy(logits, targets);
  full.backward();
  Tensor mine = slice_last_dim(detach(logits), start, slice).set_requires_grad(true);
  Tensor part = vocab_parallel_cross_entropy(mine, targets, start, tp);
  part.backward();
  CHECK(std::abs(part.item() - full.item()) < 1e-12);
  CHECK(max_abs_diff(mine.grad(), slice_last_dim(logits.grad(), start, slice)) < 1e-12);

  Tensor table = randn({v, d}, rng, DType::F64).set_requires_grad(true);
  Tensor ids = Tensor::from_indices({0, v - 1, 3, slice % v, 1, v / 2}, {2, 3});
  Tensor ref = embedding(ids, table);
  backward(ref, Tensor::full(ref.shape(), 1.0, DType::F64));
  Tensor shard = slice_dim(detach(table), 0, start, slice).set_requires_grad(true);
  Tensor got = vocab_parallel_embedding(ids, shard, start, tp);
  backward(got, Tensor::full(got.shape(), 1.0, DType::F64));
  CHECK(max_abs_diff(got, ref) == 0.0);
  CHECK(max_abs_diff(shard.grad(), slice_dim(table.grad(), 0, start, slice)) == 0.0);

  // A target beyond the whole vocabulary (tp x the slice) is an error naming it, on every rank.
  t[4] = v;
  CHECK_THROWS_WITH(vocab_parallel_cross_entropy(mine, Tensor::from_indices(t, {2, rows / 2}),
                                                 start, tp),
                    Catch::Contains("targets[4] = " + std::to_string(v)) &&
                        Catch::Contains("out of range"));
}

TEST_CASE("tp mappings: forward and backward across ranks", "[mpi]") {
  auto& tp = world();
  const int n = tp.size(), r = tp.rank();
  // reduce_from_tp sums rank-dependent inputs; its backward passes the gradient through.
  Tensor x = Tensor::full({2, 3}, r + 1.0, DType::F64).set_requires_grad(true);
  Tensor y = reduce_from_tp(x, tp);
  CHECK(y.at(0) == n * (n + 1) / 2.0);
  backward(y, Tensor::full({2, 3}, 2.0, DType::F64));
  CHECK(x.grad().at(5) == 2.0);
  // copy_to_tp: identity forward, and the gradient is summed over ranks.
  Tensor a = Tensor::full({4}, 1.5, DType::F64).set_requires_grad(true);
  Tensor b = copy_to_tp(a, tp);
  CHECK(b.at(3) == 1.5);
  backward(b, Tensor::full({4}, r + 1.0, DType::F64));
  CHECK(a.grad().at(0) == n * (n + 1) / 2.0);
  // scatter then gather is the identity; gather's backward keeps each rank's slice.
  Rng rng(5);
  Tensor whole = randn({3, 2 * n}, rng, DType::F64).set_requires_grad(true);
  Tensor back = gather_from_tp(scatter_to_tp(whole, tp), tp);
  CHECK(max_abs_diff(back, whole) == 0.0);
  backward(back, Tensor::full(back.shape(), 1.0, DType::F64));
  CHECK(max_abs_diff(whole.grad(), Tensor::full(whole.shape(), 1.0, DType::F64)) == 0.0);
}

TEST_CASE("gather_parameter reassembles shards along dim 0 and dim 1", "[mpi]") {
  auto& tp = world();
  Rng rng(3);
  Tensor w = randn({4 * tp.size(), 6 * tp.size()}, rng);
  for (int dim : {0, 1}) {
    const int64_t len = w.size(dim) / tp.size();
    ShardSpec spec{dim, w.shape(), tp.rank() * len};
    Tensor full = gather_parameter(slice_dim(w, dim, spec.offset, len), spec, tp);
    INFO("dim " << dim);
    CHECK(max_abs_diff(full, w) == 0.0);
  }
}

TEST_CASE("the tp routing check catches ranks that route differently", "[mpi]") {
  auto& tp = world();
  model::ForwardResult same, differs;
  same.routed_idx = {Tensor::from_indices({0, 2, 5, 1, 3, 4}, {2, 3})};
  CHECK_NOTHROW(check_same_routing(same, tp));
  differs.routed_idx = {Tensor::from_indices({0, 2, 5, 1, 3, 4 + tp.rank()}, {2, 3})};
  if (tp.size() > 1)
    CHECK_THROWS_WITH(check_same_routing(differs, tp),
                      Catch::Contains("routed block 0 chose different tokens on tp rank 1"));
}

namespace {
// Rank r's positions [r*t, (r+1)*t) of x [B, n*t, ...] along dim 1.
Tensor own_rows(const Tensor& x, Communicator& tp) {
  const int64_t t = x.size(1) / tp.size();
  return slice_dim(x, 1, tp.rank() * t, t);
}
}  // namespace

TEST_CASE("sequence-parallel mappings: forward and backward across ranks", "[mpi]") {
  auto& tp = world();
  const int n = tp.size(), r = tp.rank();
  const double ranks_sum = n * (n + 1) / 2.0;  // sum over ranks of (rank + 1)
  Rng rng(17);  // the same data on every rank
  const Tensor whole = randn({2, 3 * n, 4}, rng, DType::F64);
  const Tensor grad = randn({2, 3 * n, 4}, rng, DType::F64);

  // gather: every rank gets the whole sequence; its backward reduce-scatters the gradients.
  Tensor mine = own_rows(whole, tp).set_requires_grad(true);
  Tensor all = gather_seq_from_tp(mine, tp);
  CHECK(max_abs_diff(all, whole) == 0.0);
  backward(all, scale(grad, r + 1.0));
  // (Sums of n rank-scaled terms against one product: equal to rounding beyond n = 2.)
  CHECK(max_abs_diff(mine.grad(), own_rows(scale(grad, ranks_sum), tp)) < 1e-12);

  // reduce-scatter: each rank its positions of the sum; the backward all-gathers them.
  Tensor part = scale(whole, r + 1.0).set_requires_grad(true);
  Tensor sum = reduce_scatter_seq_to_tp(part, tp);
  CHECK(max_abs_diff(sum, own_rows(scale(whole, ranks_sum), tp)) < 1e-12);
  backward(sum, own_rows(grad, tp));
  CHECK(max_abs_diff(part.grad(), grad) == 0.0);

  // Around a layer run whole on every rank (the MoE layer): the gather's backward keeps the
  // rank's positions of the whole, identical gradient; the split's backward all-gathers.
  Tensor mine_whole = own_rows(whole, tp).set_requires_grad(true);
  Tensor gathered = gather_seq_whole_from_tp(mine_whole, tp);
  CHECK(max_abs_diff(gathered, whole) == 0.0);
  backward(gathered, grad);
  CHECK(max_abs_diff(mine_whole.grad(), own_rows(grad, tp)) == 0.0);
  Tensor replicated = whole.clone().set_requires_grad(true);
  Tensor kept = split_seq_to_tp(replicated, tp);
  CHECK(max_abs_diff(kept, own_rows(whole, tp)) == 0.0);
  backward(kept, own_rows(grad, tp));
  CHECK(max_abs_diff(replicated.grad(), grad) == 0.0);

  // A sequence not divisible by tp is refused, naming the sizes.
  if (n > 1) {
    CHECK_THROWS_WITH(reduce_scatter_seq_to_tp(randn({1, 3 * n + 1, 2}, rng, DType::F64), tp),
                      Catch::Contains("not divisible by tp " + std::to_string(n)));
    CHECK_THROWS_WITH(split_seq_to_tp(randn({1, 3 * n + 1, 2}, rng, DType::F64), tp),
                      Catch::Contains("not divisible by tp " + std::to_string(n)));
  }
}

TEST_CASE("MoD's routed rows on a split sequence equal gather_rows and scatter_add_rows", "[mpi]") {
  auto& tp = world();
  const int n = tp.size();
  Rng rng(23);
  const int64_t b = 2, t = 4 * n, d = 3;
  const Tensor whole = randn({b, t, d}, rng, DType::F64);
  // Ascending positions per sequence, every other one, spread over every rank's range.
  const int64_t c = t / 2;
  std::vector<int64_t> ids;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t j = 0; j < c; ++j) ids.push_back(s + 2 * j);
  const Tensor idx = Tensor::from_indices(ids, {b, c});
  const Tensor dy = randn({b, c, d}, rng, DType::F64);

  Tensor ref_x = whole.clone().set_requires_grad(true);
  Tensor ref = gather_rows(ref_x, idx);
  backward(ref, dy);
  Tensor mine = own_rows(whole, tp).set_requires_grad(true);
  Tensor got = gather_routed_rows(mine, idx, tp);
  CHECK(max_abs_diff(got, ref) == 0.0);  // every rank: all C rows
  backward(got, dy);
  CHECK(max_abs_diff(mine.grad(), own_rows(ref_x.grad(), tp)) == 0.0);

  const Tensor y = randn({b, c, d}, rng, DType::F64);
  const Tensor dout = randn({b, t, d}, rng, DType::F64);
  Tensor ref_base = whole.clone().set_requires_grad(true);
  Tensor ref_y = y.clone().set_requires_grad(true);
  Tensor ref_out = scatter_add_rows(ref_base, idx, ref_y);
  backward(ref_out, dout);
  Tensor base = own_rows(whole, tp).set_requires_grad(true);
  Tensor my_y = y.clone().set_requires_grad(true);
  Tensor out = scatter_add_routed_rows(base, idx, my_y, tp);
  CHECK(max_abs_diff(out, own_rows(ref_out, tp)) == 0.0);
  backward(out, own_rows(dout, tp));
  CHECK(max_abs_diff(base.grad(), own_rows(ref_base.grad(), tp)) == 0.0);
  CHECK(max_abs_diff(my_y.grad(), ref_y.grad()) == 0.0);  // all-reduced: whole on every rank
}
