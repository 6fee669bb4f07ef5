// The expert-parallel pair (parallel/expert_parallel.h) and the mesh's ep and edp groups
// (parallel/mesh.h), run as a world of one and under mpirun -n 2 and -n 4. Each test builds the
// mesh for every layout of the world (dp x tp = world size, ep | dp). Every rank can write down
// every rank's tensors in closed form (integers plus eighths: exact in f32 and f64), so each
// received value and each gradient is checked exactly against the rank and slot it must come from.
// Invariant: a failed check never changes which collectives a rank calls next (CHECK, not REQUIRE),
// so one failure cannot desynchronise the ranks into a hang.
#include <catch2/catch.hpp>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "parallel/counting_communicator.h"
#include "parallel/expert_parallel.h"
#include "parallel/mesh.h"
#include "parallel/world.h"

using namespace mod;
using namespace mod::parallel;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kE = 8, kSlotsPerTp = 3, kD = 5;  // E experts; S = 3 * tp slots of width D

// Every factorisation of the world: dp x tp = size, ep | dp (np4: dp4 ep1/2/4, dp2 tp2 ep1/2, tp4).
std::vector<ParallelDims> layouts(int size) {
  std::vector<ParallelDims> out;
  for (int tp = 1; tp <= size; ++tp) {
    if (size % tp != 0) continue;
    const int dp = size / tp;
    for (int ep = 1; ep <= dp; ++ep)
      if (dp % ep == 0) out.push_back(ParallelDims{dp, tp, ep});
  }
  return out;
}

std::string layout_name(const ParallelDims& d) {
  return "dp" + std::to_string(d.dp) + " tp" + std::to_string(d.tp) + " ep" + std::to_string(d.ep);
}

// Where a world rank sits: dp and tp rank, ep rank, and the first dp rank of its ep group.
struct Place {
  int dp, tp, ep, base;
};
Place place_of(int world_rank, const ParallelDims& d) {
  const int dp = world_rank / d.tp;
  return Place{dp, world_rank % d.tp, dp % d.ep, dp - dp % d.ep};
}

// x on dp rank `dp` (the same on its tp ranks): expert e, slot s, column c.
double x_value(int dp, int64_t e, int64_t s, int64_t c) {
  return 1000.0 * dp + 100.0 * e + s + 0.125 * c;
}
// A tensor that differs on every rank (y, loss weights): index (a, b, c) on rank (dp, tp).
double rank_value(int dp, int tp, int64_t a, int64_t b, int64_t c) {
  return 10000.0 * tp + 1000.0 * dp + 100.0 * a + b + 0.125 * c;
}

using Fn3 = std::function<double(int64_t, int64_t, int64_t)>;

Tensor make(const Shape& shape, DType dtype, const Fn3& f) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t a = 0, i = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c) t.set(i++, f(a, b, c));
  return t;
}

// "" when t has `shape` and t[a, b, c] == f(a, b, c) exactly; else the first difference.
std::string mismatch(const Tensor& t, const Shape& shape, const Fn3& f) {
  if (!t.defined()) return "undefined tensor";
  if (t.shape() != shape) return "shape " + shape_str(t.shape()) + ", expected " + shape_str(shape);
  for (int64_t a = 0, i = 0; a < shape[0]; ++a)
    for (int64_t b = 0; b < shape[1]; ++b)
      for (int64_t c = 0; c < shape[2]; ++c, ++i)
        if (t.at(i) != f(a, b, c)) {
          std::ostringstream os;
          os << "at [" << a << ", " << b << ", " << c << "]: got " << t.at(i) << ", expected "
             << f(a, b, c);
          return os.str();
        }
  return "";
}

// The world ranks of `group`, in group-rank order (an all-gather of each member's world rank).
std::vector<int64_t> members(Communicator& group) {
  Tensor mine = Tensor::from_indices({world().rank()}, {1});
  Tensor all = Tensor::empty({group.size()}, DType::I64);
  group.all_gather(mine, all);
  std::vector<int64_t> out;
  for (int i = 0; i < group.size(); ++i) out.push_back(static_cast<int64_t>(all.at(i)));
  return out;
}

// what() of the std::invalid_argument that f throws; otherwise a line saying what happened.
std::string invalid_argument_from(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an invalid_argument: ") + e.what();
  }
  return "no exception";
}

// Thrown by ShapeOnlyCommunicator's collectives; not an std::invalid_argument, so a test can
// tell "reached communication" from "rejected the arguments".
struct NoCollective : std::runtime_error {
  NoCollective() : std::runtime_error("shape-only communicator: no collectives") {}
};

// A group of `size` that knows only its rank and size, for argument checks (they throw before
// any communication); every collective throws NoCollective.
class ShapeOnlyCommunicator final : public Communicator {
 public:
  ShapeOnlyCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void all_reduce(const Tensor&, ReduceOp) override { fail(); }
  std::unique_ptr<Work> all_reduce_async(const Tensor&, ReduceOp) override { fail(); }
  void reduce_scatter(const Tensor&, const Tensor&, ReduceOp) override { fail(); }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override {
    fail();
  }
  void all_gather(const Tensor&, const Tensor&) override { fail(); }
  void all_to_all(const Tensor&, const Tensor&) override { fail(); }
  void broadcast(const Tensor&, int) override { fail(); }
  void barrier() override { fail(); }
  void send(const Tensor&, int, int) override { fail(); }
  void recv(const Tensor&, int, int) override { fail(); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { fail(); }
  [[noreturn]] void abort(const std::string&, int) override { fail(); }

 private:
  [[noreturn]] static void fail() { throw NoCollective(); }
  int rank_, size_;
  std::string name_ = "shape-only";
};

}  // namespace

TEST_CASE("mesh: ep and edp groups have the documented sizes and members", "[mpi]") {
  const int r = world().rank();
  for (const ParallelDims& d : layouts(world().size())) {
    INFO("layout " << layout_name(d) << ", world rank " << r);
    Mesh mesh(world(), d);
    const Place p = place_of(r, d);
    std::vector<int64_t> tp, dp, ep, edp;
    for (int t = 0; t < d.tp; ++t) tp.push_back(p.dp * d.tp + t);
    for (int i = 0; i < d.dp; ++i) dp.push_back(i * d.tp + p.tp);
    for (int i = 0; i < d.ep; ++i) ep.push_back((p.base + i) * d.tp + p.tp);
    for (int w = 0; w < world().size(); ++w)
      if ((w / d.tp) % d.ep == p.ep) edp.push_back(w);

    CHECK(mesh.dp_rank() == p.dp);
    CHECK(mesh.tp_rank() == p.tp);
    CHECK(mesh.ep_rank() == p.ep);
    CHECK(mesh.ep().size() == d.ep);
    CHECK(mesh.edp().size() == d.dp / d.ep * d.tp);
    CHECK(mesh.ep().name() == "ep");
    CHECK(mesh.edp().name() == "edp");
    CHECK(members(mesh.tp()) == tp);
    CHECK(members(mesh.dp()) == dp);
    CHECK(members(mesh.ep()) == ep);
    CHECK(members(mesh.edp()) == edp);
  }
}

TEST_CASE("dispatch_to_experts sends each expert's tp share to its ep rank, source-major",
          "[mpi]") {
  for (const ParallelDims& d : layouts(world().size()))
    for (DType dtype : {DType::F32, DType::F64}) {
      INFO("layout " << layout_name(d) << ", " << dtype_name(dtype) << ", world rank "
                     << world().rank());
      CountingCommunicator counted(world());
      Mesh mesh(counted, d);
      const Place p = place_of(world().rank(), d);
      const int64_t El = kE / d.ep, S = kSlotsPerTp * d.tp, sl = kSlotsPerTp;
      const Tensor x = make({kE, S, kD}, dtype, [&](int64_t e, int64_t s, int64_t c) {
        return x_value(p.dp, e, s, c);
      });

      counted.reset_stats();
      const Tensor out = dispatch_to_experts(x, mesh.ep(), mesh.tp());
      const Stats st = counted.stats();
      // Local expert le, row i * sl + j: slot t * sl + j of expert ep_rank * El + le on ep rank i.
      CHECK(mismatch(out, {El, d.ep * sl, kD}, [&](int64_t le, int64_t row, int64_t c) {
              return x_value(p.base + static_cast<int>(row / sl), p.ep * El + le,
                             p.tp * sl + row % sl, c);
            }) == "");
      CHECK(out.dtype() == dtype);
      CHECK(out.raw_data() != x.raw_data());
      // One all-to-all over ep of E * S/tp * D elements when ep > 1 (a group of one is
      // skipped), nothing over tp.
      const bool ep_alone = d.ep == 1;
      CHECK(st.group("ep")[Collective::AllToAll].calls == (ep_alone ? 0 : 1));
      CHECK(st.group("ep")[Collective::AllToAll].tensor_bytes ==
            (ep_alone ? 0 : kE * sl * kD * static_cast<int64_t>(dtype_size(dtype))));
      CHECK(st.group("tp").total().calls == 0);
      CHECK(st.total().calls == (ep_alone ? 0 : 1));

      // combine undoes dispatch.
      CHECK(mismatch(combine_from_experts(out, mesh.ep(), mesh.tp()), x.shape(),
                     [&](int64_t e, int64_t s, int64_t c) { return x_value(p.dp, e, s, c); }) ==
            "");
    }
}

TEST_CASE("combine_from_experts returns slots to their expert and all-gathers the tp shares",
          "[mpi]") {
  for (const ParallelDims& d : layouts(world().size()))
    for (DType dtype : {DType::F32, DType::F64}) {
      INFO("layout " << layout_name(d) << ", " << dtype_name(dtype) << ", world rank "
                     << world().rank());
      CountingCommunicator counted(world());
      Mesh mesh(counted, d);
      const Place p = place_of(world().rank(), d);
      const int64_t El = kE / d.ep, S = kSlotsPerTp * d.tp, sl = kSlotsPerTp;
      auto y_value = [&](int64_t le, int64_t row, int64_t c) {
        return rank_value(p.dp, p.tp, le, row, c);
      };
      const Tensor y = make({El, d.ep * sl, kD}, dtype, y_value);

      counted.reset_stats();
      const Tensor out = combine_from_experts(y, mesh.ep(), mesh.tp());
      const Stats st = counted.stats();
      // Expert e = k * El + le, slot t * sl + j: row (my ep rank) * sl + j of y on rank
      // (base + k, t).
      CHECK(mismatch(out, {kE, S, kD}, [&](int64_t e, int64_t s, int64_t c) {
              return rank_value(p.base + static_cast<int>(e / El), static_cast<int>(s / sl), e % El,
                                p.ep * sl + s % sl, c);
            }) == "");
      // An all-to-all over ep and an all-gather over tp, each skipped on a group of one.
      const bool ep_alone = d.ep == 1, tp_alone = d.tp == 1;
      const int64_t es = static_cast<int64_t>(dtype_size(dtype));
      CHECK(st.group("ep")[Collective::AllToAll].calls == (ep_alone ? 0 : 1));
      CHECK(st.group("ep")[Collective::AllToAll].tensor_bytes == (ep_alone ? 0 : kE * sl * kD * es));
      CHECK(st.group("tp")[Collective::AllGather].calls == (tp_alone ? 0 : 1));
      CHECK(st.group("tp")[Collective::AllGather].tensor_bytes == (tp_alone ? 0 : kE * S * kD * es));
      CHECK(out.raw_data() != y.raw_data());

      // The result is the same on every tp rank, so dispatching it again gives back y.
      CHECK(mismatch(dispatch_to_experts(out, mesh.ep(), mesh.tp()), y.shape(), y_value) == "");
    }
}

TEST_CASE("dispatch and combine gradients reach the slots they came from", "[mpi]") {
  for (const ParallelDims& d : layouts(world().size()))
    for (DType dtype : {DType::F32, DType::F64}) {
      INFO("layout " << layout_name(d) << ", " << dtype_name(dtype) << ", world rank "
                     << world().rank());
      Mesh mesh(world(), d);
      const Place p = place_of(world().rank(), d);
      const int64_t El = kE / d.ep, S = kSlotsPerTp * d.tp, sl = kSlotsPerTp;

      // loss = sum(dispatch(x) * w), w = rank_value on each rank: x's gradient at expert
      // k * El + le, slot t * sl + j is w[le, (my ep rank) * sl + j] of rank (base + k, t); the tp
      // shares are all-gathered, so every tp rank gets the whole gradient.
      Tensor x = make({kE, S, kD}, dtype, [&](int64_t e, int64_t s, int64_t c) {
                   return x_value(p.dp, e, s, c);
                 }).set_requires_grad(true);
      Tensor out = dispatch_to_experts(x, mesh.ep(), mesh.tp());
      const Tensor w = make(out.shape(), dtype, [&](int64_t le, int64_t row, int64_t c) {
        return rank_value(p.dp, p.tp, le, row, c);
      });
      sum(mul(out, w)).backward();
      CHECK(mismatch(x.grad(), x.shape(), [&](int64_t e, int64_t s, int64_t c) {
              return rank_value(p.base + static_cast<int>(e / El), static_cast<int>(s / sl), e % El,
                                p.ep * sl + s % sl, c);
            }) == "");

      // loss = sum(combine(y) * v): y's gradient at local expert le, row i * sl + j is v at
      // expert (my ep rank) * El + le, slot (my tp rank) * sl + j on rank (base + i, my tp rank).
      Tensor y = make({El, d.ep * sl, kD}, dtype, [&](int64_t le, int64_t row, int64_t c) {
                   return rank_value(p.dp, p.tp, le, row, c);
                 }).set_requires_grad(true);
      Tensor back = combine_from_experts(y, mesh.ep(), mesh.tp());
      const Tensor v = make(back.shape(), dtype, [&](int64_t e, int64_t s, int64_t c) {
        return rank_value(p.dp, p.tp, e, s, c);
      });
      sum(mul(back, v)).backward();
      CHECK(mismatch(y.grad(), y.shape(), [&](int64_t le, int64_t row, int64_t c) {
              return rank_value(p.base + static_cast<int>(row / sl), p.tp, p.ep * El + le,
                                p.tp * sl + row % sl, c);
            }) == "");
    }
}

TEST_CASE("expert ops reject shapes that do not split, naming the shape", "[mpi]") {
  ShapeOnlyCommunicator one(0, 1), two(1, 2);
  CHECK_THAT(
      invalid_argument_from([&] {
        dispatch_to_experts(Tensor::zeros({3, 4, 2}), two, one);
      }),
      Contains("dispatch_to_experts: x f32[3, 4, 2] on cpu: experts E=3 not divisible by ep=2"));
  CHECK_THAT(invalid_argument_from([&] {
               dispatch_to_experts(Tensor::zeros({4, 3, 2}, DType::F64), one, two);
             }),
             Contains("x f64[4, 3, 2] on cpu: expert slots S=3 not divisible by tp=2"));
  CHECK_THAT(invalid_argument_from([&] {
               dispatch_to_experts(Tensor::zeros({4, 4}), one, one);
             }),
             Contains("x f32[4, 4] on cpu must be a 3-D floating tensor"));
  CHECK_THAT(invalid_argument_from([&] {
               dispatch_to_experts(Tensor::zeros({2, 2, 2}, DType::I64), one, one);
             }),
             Contains("x i64[2, 2, 2] on cpu must be a 3-D floating tensor"));
  CHECK_THAT(invalid_argument_from([&] {
               combine_from_experts(Tensor::zeros({2, 3, 2}), two, one);
             }),
             Contains("combine_from_experts: y f32[2, 3, 2] on cpu: dim 1 (ep * S/tp = 3) "
                      "not divisible by ep=2"));
  CHECK_THAT(invalid_argument_from([&] {
               combine_from_experts(Tensor::zeros({2, 3}), one, one);
             }),
             Contains("y f32[2, 3] on cpu must be a 3-D floating tensor"));
  // Shapes that split pass validation and reach the (absent) communication.
  CHECK_THROWS_AS(dispatch_to_experts(Tensor::zeros({4, 4, 2}), two, two), NoCollective);
  CHECK_THROWS_AS(combine_from_experts(Tensor::zeros({2, 4, 2}), two, two), NoCollective);
}

TEST_CASE("validate_model: ep needs experts and must divide model.moe.n_experts", "[mpi]") {
  modtrain::ModelConfig m;
  m.set_n_heads(4);
  m.set_d_ff(16);
  m.set_vocab_size(32);
  CHECK_NOTHROW(ParallelDims{2, 1, 1}.validate_model(m));
  CHECK_THAT(invalid_argument_from([&] {
               ParallelDims{2, 1, 2}.validate_model(m);
             }),
             Contains("parallel.ep = 2 needs model.moe.enabled (no experts to place)"));
  m.mutable_moe()->set_enabled(true);
  m.mutable_moe()->set_n_experts(6);
  CHECK_NOTHROW(ParallelDims{2, 1, 2}.validate_model(m));
  CHECK_NOTHROW(ParallelDims{4, 2, 1}.validate_model(m));
  CHECK_THAT(invalid_argument_from([&] {
               ParallelDims{4, 1, 4}.validate_model(m);
             }),
             Contains("parallel.ep (4) must divide model.moe.n_experts (6): 6 = 4 x 1 + 2"));
}
