// ZeRO-2 and ZeRO-3 with experts (parallel/zero3.h): a block's experts live in its unit and are
// sharded over edp, the ranks holding the same experts, while its dense parameters shard over dp.
// - np2, staged and integrated MoDE at dp2 x ep2 (edp of one: the experts stay whole, the dense
//   parameters are halved): stage 3 (and for staged stage 2) equals plain dp2 x ep2 bit for bit
//   (at dp 2 every sum is a + b, and the gathered parameters are exact copies); plain dp2 x ep2
//   is held to one process within 1e-5 by mode_parity_tests, so these are too.
// - np2, tiny_moe at dp2 (ep 1: edp spans the dp ranks, so the experts are halved too): stage 3
//   equals plain dp2 bitwise and one process to 1e-5.
// - np4, staged MoDE at dp4 x ep2 (edp of two: experts halved, dense parameters quartered): stage 3 against stage 2 bit for bit (the
//   same reduce-scatters, the same sums), and one process to 1e-5.
// - np4, staged MoDE (shrunk) at dp2 x tp2 x ep2 (edp the tp pair: experts halved over it, each
//   tp shard of the dense parameters halved over dp): stage 3 against stage 2 bit for bit, and
//   one process to 1e-5.
// - np2, staged and integrated MoDE at dp2 x ep2 under stage 3 with train.recompute FULL and
//   SELECTIVE (every block: each a recompute region holding experts), 2 steps, against stage 3
//   keeping every activation at the same layout bit for bit: losses, gradient norms, every
//   routed block's chosen tokens (staged) and every MoE layer's expert slots per step, final
//   parameters.
//   The region reruns the same ops (the all-to-alls included) on the unit gathered again for
//   the block's backward, so anything read from a released or stale expert shows. Each rank's
//   peak is below keeping everything (a unit held past its region's backward shows there),
//   FULL's below SELECTIVE's.

#include <cstring>

#include "tests/support/bitwise.h"
#include "tests/support/parity_harness.h"

using namespace mod;
using test::parity::RunResult;

namespace {
constexpr int kSteps = 3;

RunResult run_layout(const std::string& name, const std::string& layout) {
  return test::parity::train(test::parity::recipe(name, layout, kSteps), parallel::world());
}

// A run with what else it logs per step: gradient norms, the routed blocks' chosen indices and
// the MoE layers' expert slots (host copies).
struct LoggedRun {
  RunResult run;
  std::vector<double> grad_norms;
  std::vector<std::vector<Tensor>> routing, moe_slots;
  double peak_bytes = 0;  // this rank's, above what was in use before the run
};

LoggedRun run_logged(const std::string& name, const std::string& layout, int steps,
                     const std::vector<std::string>& extra) {
  LoggedRun out;
  train::TestHooks hooks;
  hooks.routing_log = &out.routing;
  hooks.moe_slots_log = &out.moe_slots;
  const double before = static_cast<double>(backend(Device::CPU).memory_stats().in_use_bytes);
  train::Trainer trainer(test::parity::recipe(name, layout, steps, extra),
                         test::temp_dir("zero3_experts"), /*quiet=*/true, parallel::world(), hooks);
  trainer.run();
  out.run = {trainer.losses(), trainer.full_parameters()};
  for (auto& [n, p] : out.run.params) p = p.to(Device::CPU);
  out.grad_norms = trainer.grad_norms();
  out.peak_bytes = static_cast<double>(trainer.peak_memory_bytes()) - before;
  return out;
}

// Per step, per layer: the same shapes and bytes.
void check_logged_bits(const std::vector<std::vector<Tensor>>& got,
                       const std::vector<std::vector<Tensor>>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    REQUIRE(got[s].size() == want[s].size());
    for (size_t l = 0; l < got[s].size(); ++l) {
      INFO(what << " at step " << s + 1 << ", layer " << l);
      const Tensor a = got[s][l].to(Device::CPU), b = want[s][l].to(Device::CPU);
      REQUIRE(a.shape() == b.shape());
      CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
    }
  }
}

void check_bits(const RunResult& got, const RunResult& want) {
  test::check_runs_bitwise(got.losses, got.params, want.losses, want.params);
}

void check_close(const RunResult& got, const RunResult& want) {
  constexpr double kBound = test::parity::kTolerance;
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s + 1 << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= kBound * std::abs(want.losses[s]));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    INFO("parameter " << got.params[i].first);
    CHECK(test::relative_norm_diff(got.params[i].second, want.params[i].second) < kBound);
  }
}
}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 with experts over edp equal plain dp x ep bitwise at dp 2",
          "[mpi][zero3][experts]") {
  auto& world = parallel::world();
  if (world.size() != 2) return;
  for (const char* name : {"tiny_mode_staged", "tiny_mode_integrated"}) {
    INFO(name << " at dp2 x ep2, world rank " << world.rank());
    const RunResult plain = run_layout(name, "dp=2 ep=2");
    if (std::string(name) == "tiny_mode_staged") {
      INFO("stage 2");
      check_bits(run_layout(name, "dp=2 ep=2 zero_stage=2"), plain);
    }
    INFO("stage 3");
    check_bits(run_layout(name, "dp=2 ep=2 zero_stage=3"), plain);
  }
  INFO("tiny_moe at dp2 (ep 1), stage 3");
  const RunResult moe3 = run_layout("tiny_moe", "dp=2 zero_stage=3");
  check_bits(moe3, run_layout("tiny_moe", "dp=2"));
  check_close(moe3, test::parity::reference("tiny_moe", kSteps));
}

// Recomputation is bitwise to keeping everything at the same layout and stage (the same ops on
// the same values, in the same order), which the case above holds to plain dp2 x ep2 bitwise.
TEST_CASE("ZeRO-3 with experts under recomputation gathers again: bitwise to keeping everything",
          "[mpi][zero3][experts][recompute]") {
  auto& world = parallel::world();
  if (world.size() != 2) return;
  constexpr int kRecomputeSteps = 2;
  const std::string layout = "dp=2 ep=2 zero_stage=3";
  for (const char* name : {"tiny_mode_staged", "tiny_mode_integrated"}) {
    const LoggedRun kept = run_logged(name, layout, kRecomputeSteps, {});
    REQUIRE(kept.routing.size() == kRecomputeSteps);  // logged: the checks below compare some
    REQUIRE(kept.moe_slots.size() == kRecomputeSteps);
    // Integrated MoDE routes through its experts' slots alone (no MoD router).
    if (std::string(name) == "tiny_mode_staged") REQUIRE(!kept.routing.front().empty());
    REQUIRE(!kept.moe_slots.front().empty());
    double full_peak = 0;
    for (const char* mode : {"FULL", "SELECTIVE"}) {
      INFO(name << " at dp2 x ep2 stage 3, train.recompute=" << mode << ", world rank "
                << world.rank());
      const LoggedRun got =
          run_logged(name, layout, kRecomputeSteps, {std::string("train.recompute=") + mode});
      check_bits(got.run, kept.run);
      test::check_bitwise(got.grad_norms, kept.grad_norms);
      check_logged_bits(got.routing, kept.routing, "chosen tokens");
      check_logged_bits(got.moe_slots, kept.moe_slots, "expert slots");
      // Each recomputed block's unit released once its region's backward is done: a region that
      // lost its experts' edges holds them to the step's end, above keeping everything.
      CHECK(got.peak_bytes < kept.peak_bytes);
      if (std::string(mode) == "FULL")
        full_peak = got.peak_bytes;
      else
        CHECK(full_peak < got.peak_bytes);  // SELECTIVE keeps the GEMM outputs besides
    }
  }
}

TEST_CASE("ZeRO-3 with experts halved over edp at dp4 x ep2 equals ZeRO-2 and one process",
          "[mpi][zero3][experts]") {
  auto& world = parallel::world();
  if (world.size() != 4) return;
  INFO("tiny_mode_staged at dp4 x ep2, world rank " << world.rank());
  const RunResult stage3 = run_layout("tiny_mode_staged", "dp=4 ep=2 zero_stage=3");
  check_bits(stage3, run_layout("tiny_mode_staged", "dp=4 ep=2 zero_stage=2"));
  check_close(stage3, test::parity::reference("tiny_mode_staged", kSteps));
}

// ZeRO-3 with experts and tp together, dp2 x tp2 x ep2 (np4): each tp rank's dense shards
// sharded over its dp pair; the experts (whole on both tp ranks of an ep rank, which split the
// slots) sharded over edp, the ranks holding the same experts: the tp pair. Stage 3 against
// stage 2 at the same layout bit for bit (the same reduce-scatters; the gathered parameters are
// exact copies), and one process to 1e-5 (tp's partial sums and the dp means in another order).
// Shrunk to 2 blocks of width 64 (a dense one and a routed one, each with experts) so that
// 4 ranks on 2 cores finish in seconds.
TEST_CASE("ZeRO-3 with experts and tp at dp2 x tp2 x ep2 equals ZeRO-2 and one process",
          "[mpi][zero3][experts][tp]") {
  auto& world = parallel::world();
  if (world.size() != 4) return;
  const std::vector<std::string> small = {"model.n_layers=2", "model.d_model=64", "model.d_ff=256"};
  auto run = [&](const std::string& layout) {
    return test::parity::train(test::parity::recipe("tiny_mode_staged", layout, kSteps, small), world);
  };
  INFO("tiny_mode_staged (2 blocks of width 64) at dp2 x tp2 x ep2, world rank " << world.rank());
  const RunResult stage3 = run("dp=2 tp=2 ep=2 zero_stage=3");
  check_bits(stage3, run("dp=2 tp=2 ep=2 zero_stage=2"));
  check_close(stage3, test::parity::reference("tiny_mode_staged", kSteps, small));
}
