// tiny_dense and tiny_mod (with its predictor) under every dp x tp (x ZeRO stage) layout the
// world size allows, against one process (see parity_harness.h); ZeRO-1's overlapped gradient
// reduce-scatter against a single bucket, and ZeRO-2 (gradients released, with and without
// gradient accumulation) against ZeRO-1, bitwise; and the predictor's detachment, bitwise.
#include <cstring>

#include "model/parameter_roles.h"
#include "tests/support/bitwise.h"
#include "tests/support/parity_harness.h"

using namespace mod;
using mod::test::parity::check_layouts;

TEST_CASE("tiny_dense: every layout matches one process for 20 steps", "[mpi][parity]") {
  check_layouts("tiny_dense");
}

TEST_CASE("tiny_mod: every layout matches one process for 20 steps", "[mpi][parity]") {
  check_layouts("tiny_mod");
}

namespace {
void check_same_bits(const test::parity::RunResult& got, const test::parity::RunResult& want) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s + 1);
    CHECK(got.losses[s] == want.losses[s]);
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    INFO(got.params[i].first);
    const Tensor& a = got.params[i].second;
    const Tensor& b = want.params[i].second;
    REQUIRE(a.nbytes() == b.nbytes());
    CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
  }
}
}  // namespace

// Many small buckets, each reduce-scattered from backward's grad-ready hook as soon as it is
// full, against one bucket for the whole model, reduced after backward. At dp = 2 each sum is
// a + b whatever algorithm MPI picks for a message size, so the runs agree to the bit. ZeRO-2
// reduces the same sums and drops each full gradient once packed (one bucket in flight), the
// norm and the update reading the owned slices from the buckets: bitwise ZeRO-1 again. Every
// step is clipped (optimizer.grad_clip 0.05), so a norm that missed a slice would show.
TEST_CASE("ZeRO-1: buckets reduce-scattered during backward equal one bucket bitwise; ZeRO-2 too",
          "[mpi][parity]") {
  auto& world = parallel::world();
  if (world.size() != 2 && world.size() != 4) {
    WARN("needs 2 or 4 processes (dp = 2)");
    return;
  }
  const std::string layout = world.size() == 2 ? "dp=2 tp=1" : "dp=2 tp=2";
  namespace p = test::parity;
  auto run = [&](const std::string& stage, const std::string& bucket_mb,
                 const std::string& grad_accum = "1") {
    return p::train(p::recipe("tiny_mod", layout + " zero_stage=" + stage, 10,
                              {"parallel.bucket_mb=" + bucket_mb, "optimizer.grad_clip=0.05",
                               "train.grad_accum=" + grad_accum}),
                    world);
  };
  INFO("layout " << layout << ", world rank " << world.rank());
  const p::RunResult one = run("1", "4096");
  {
    INFO("ZeRO-1, 50 KB buckets");
    check_same_bits(run("1", "0.05"), one);
  }
  {
    INFO("ZeRO-2, 50 KB buckets");
    check_same_bits(run("2", "0.05"), one);
  }
  // Under accumulation the full gradients are kept until the last micro-batch's backward,
  // which reduce-scatters them once (docs/parallel.md): the same sums as ZeRO-1's.
  if (world.size() == 2) {
    INFO("ZeRO-2 against ZeRO-1, two micro-batches a step");
    check_same_bits(run("2", "0.05", "2"), run("1", "4096", "2"));
  }
}

// The causal predictor learns from the detached block input and is clipped by its own norm
// (model.mod.causal.predictor_grad_clip), so the language model trains exactly as if it had
// none: after 30 steps, every one clipped (optimizer.grad_clip 0.05), tiny_mod's parameters
// other than the predictors' equal, bit for bit, those of a run whose predictor loss weighs 0
// (zero predictor gradients), in one process and in the layouts the world size allows.
TEST_CASE("tiny_mod: the causal predictor leaves the language model's training untouched",
          "[mpi][parity]") {
  auto& world = parallel::world();
  namespace p = test::parity;
  auto same_lm = [](const p::RunResult& with, const p::RunResult& without) {
    REQUIRE(with.params.size() == without.params.size());
    size_t compared = 0;
    for (size_t i = 0; i < with.params.size(); ++i) {
      const auto& [name, a] = with.params[i];
      if (model::is_causal_predictor(name)) continue;
      INFO(name);
      test::check_bitwise(a.to_vector(), without.params[i].second.to_vector());
      ++compared;
    }
    CHECK(compared > 0);
  };
  auto run = [&](const std::string& layout, double weight, parallel::Communicator& comm) {
    return p::train(p::recipe("tiny_mod", layout, 30,
                              {"optimizer.grad_clip=0.05", "model.mod.causal.predictor_grad_clip=0.05",
                               "model.mod.causal.predictor_weight=" + std::to_string(weight)}),
                    comm);
  };
  if (world.rank() == 0) {
    INFO("one process");
    auto local = parallel::make_local_communicator();
    same_lm(run("", 1.0, *local), run("", 0.0, *local));
  }
  std::vector<std::string> layouts;
  if (world.size() == 2) layouts = {"dp=2 tp=1 zero1=true", "dp=1 tp=2"};
  if (world.size() == 4) layouts = {"dp=2 tp=2 zero1=true"};
  for (const std::string& layout : layouts) {
    INFO("layout " << layout << ", world rank " << world.rank());
    same_lm(run(layout, 1.0, world), run(layout, 0.0, world));
  }
}
