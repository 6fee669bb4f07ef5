// ZeRO with tensor and sequence parallelism at dp2 x tp2 (np4; other world sizes skip):
// - ZeRO-3 over shards of tp shards: tiny_dense and tiny_mod (predictor) against ZeRO-2 at the
//   same layout bit for bit (the dp sums are a + b either way and the gathered parameters are
//   exact copies), and against one process to a relative 1e-5. Every step is clipped
//   (optimizer.grad_clip 0.05), so a norm that missed a tp shard or a dp slice shows.
// - tiny_mod's stage-3 checkpoint (step 2 of 3) resumed at dp2 ZeRO-1 (world ranks 0 and 1) and
//   on one process (world rank 2), tensors by global name: the tail to 1e-5 (tp's sum order
//   differs).
// - Sequence parallelism with ZeRO 1, 2 and 3: stage 2 equals stage 1 and stage 3 equals stage
//   2 bitwise; every routed block's chosen indices equal plain tp's (ZeRO-1, no SP) at every
//   step; against one process to 1e-5 and against plain tp to the bounds of parity_test.cpp's
//   SP case (the sequence-partial gradients, summed over tp in ZeRO's owned slices).
// - Memory: ZeRO-3 at dp2 x tp2, with and without SP: each rank's measured peak within 10% of
//   the planner.
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "core/backend.h"
#include "model/memory_plan.h"
#include "tests/support/parity_harness.h"
#include "tests/support/bitwise.h"
#include "tests/support/shared_dir.h"
#include "train/checkpoint/checkpoint.h"

using namespace mod;
namespace p = test::parity;

namespace {
constexpr int kSteps = 3;
const std::vector<std::string> kClipped = {"optimizer.grad_clip=0.05"};

struct LoggedRun {
  p::RunResult run;
  std::vector<std::vector<Tensor>> routing;  // per step, per routed block: idx [B,C]
};

// Trains on comm (every run checks that the tp ranks route alike); with `from`, resumed first.
LoggedRun train_logged(const modtrain::RunConfig& cfg, parallel::Communicator& comm,
                       const std::string& dir = "", const std::string& from = "") {
  LoggedRun out;
  train::TestHooks hooks;
  hooks.check_tp_routing = true;
  hooks.routing_log = &out.routing;
  train::Trainer trainer(cfg, dir.empty() ? test::temp_dir("zero3_tp") : dir, /*quiet=*/true, comm,
                         hooks);
  if (!from.empty()) trainer.resume(from);
  trainer.run();
  out.run = {trainer.losses(), trainer.full_parameters()};
  for (auto& [name, t] : out.run.params) t = t.to(Device::CPU);
  return out;
}

void check_bits(const p::RunResult& got, const p::RunResult& want) {
  test::check_runs_bitwise(got.losses, got.params, want.losses, want.params);
}

void check_close(const p::RunResult& got, const p::RunResult& want, double loss_bound,
                 double param_bound) {
  REQUIRE(got.losses.size() == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    INFO("step " << s + 1 << ": " << got.losses[s] << " vs " << want.losses[s]);
    CHECK(std::abs(got.losses[s] - want.losses[s]) <= loss_bound * std::abs(want.losses[s]));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i) {
    INFO("parameter " << got.params[i].first);
    CHECK(test::relative_norm_diff(got.params[i].second, want.params[i].second) < param_bound);
  }
}

// One process's run of a recipe (clipped, kSteps), trained once per test program.
const p::RunResult& reference(const std::string& name) {
  static std::map<std::string, p::RunResult> done;
  if (!done.count(name)) done[name] = p::reference(name, kSteps, kClipped);
  return done.at(name);
}

modtrain::RunConfig recipe(const std::string& name, const std::string& layout,
                           std::vector<std::string> extra = {}) {
  extra.insert(extra.end(), kClipped.begin(), kClipped.end());
  return p::recipe(name, layout, kSteps, extra);
}

bool four() {
  if (parallel::world().size() == 4) return true;
  WARN("needs 4 processes (dp 2 x tp 2)");
  return false;
}
}  // namespace

TEST_CASE(
    "ZeRO-3 at dp2 x tp2 equals ZeRO-2 bitwise and one process; its checkpoint resumes "
    "at dp2 ZeRO-1 and on one process",
    "[mpi][zero3]") {
  if (!four()) return;
  auto& world = parallel::world();
  for (const char* name : {"tiny_dense", "tiny_mod"}) {
    INFO(name << ", world rank " << world.rank());
    const bool resumes = std::string(name) == "tiny_mod";
    const std::string dir3 = test::shared_dir("zero3_tp_saved", world);
    const LoggedRun stage3 =
        train_logged(recipe(name, "dp=2 tp=2 zero_stage=3",
                            resumes ? std::vector<std::string>{"checkpoint.every_steps=2"}
                                    : std::vector<std::string>{}),
                     world, dir3);
    {
      INFO("against ZeRO-2 at dp2 x tp2");
      check_bits(stage3.run, train_logged(recipe(name, "dp=2 tp=2 zero_stage=2"), world).run);
    }
    {
      INFO("against one process");
      check_close(stage3.run, reference(name), p::kTolerance, p::kTolerance);
    }
    if (!resumes) continue;
    const std::string step2 = ckpt::checkpoints_dir(dir3) + "/" + ckpt::step_dir_name(2);
    const p::RunResult tail{{stage3.run.losses.begin() + 2, stage3.run.losses.end()},
                            stage3.run.params};
    // Ranks 0 and 1 resume at dp2 ZeRO-1 while rank 2 resumes alone.
    auto pair = world.split(world.rank() / 2, world.rank(), "resume_pair");
    if (world.rank() < 2) {
      INFO("stage 3 dp2 x tp2 -> stage 1 dp2");
      const auto cfg = p::recipe(name, "dp=2 zero_stage=1", kSteps, kClipped);
      check_close(train_logged(cfg, *pair, test::shared_dir("zero3_tp_dp2", *pair), step2).run,
                  tail, p::kTolerance, p::kTolerance);
    } else if (world.rank() == 2) {
      INFO("stage 3 dp2 x tp2 -> one process");
      auto local = parallel::make_local_communicator();
      check_close(train_logged(p::recipe(name, "", kSteps, kClipped), *local, "", step2).run, tail,
                  p::kTolerance, p::kTolerance);
    }
    world.barrier();
  }
}

TEST_CASE(
    "sequence parallelism with ZeRO 1, 2 and 3 at dp2 x tp2: plain tp's routing, "
    "stages bitwise alike",
    "[mpi][zero3][sp]") {
  if (!four()) return;
  auto& world = parallel::world();
  constexpr double kSpLossBound = 2e-6, kSpParamBound = 1e-5;  // as parity_test.cpp's SP case
  const std::string name = "tiny_mod";
  const LoggedRun plain = train_logged(recipe(name, "dp=2 tp=2 zero_stage=1"), world);
  REQUIRE(!plain.routing.empty());
  REQUIRE(!plain.routing.front().empty());
  std::optional<LoggedRun> previous;
  for (int stage : {1, 2, 3}) {
    INFO(name << " at dp2 x tp2 sequence_parallel zero_stage " << stage << ", world rank "
              << world.rank());
    const LoggedRun split = train_logged(
        recipe(name, "dp=2 tp=2 sequence_parallel=true zero_stage=" + std::to_string(stage)),
        world);
    REQUIRE(split.routing.size() == plain.routing.size());
    for (size_t s = 0; s < split.routing.size(); ++s) {
      REQUIRE(split.routing[s].size() == plain.routing[s].size());
      for (size_t k = 0; k < split.routing[s].size(); ++k) {
        INFO("step " << s + 1 << ", routed block " << k);
        const Tensor& a = split.routing[s][k];
        const Tensor& b = plain.routing[s][k];
        REQUIRE(a.nbytes() == b.nbytes());
        CHECK(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0);
      }
    }
    CHECK(split.run.losses[0] == plain.run.losses[0]);
    {
      INFO("against plain tp (ZeRO-1, no SP)");
      check_close(split.run, plain.run, kSpLossBound, kSpParamBound);
    }
    {
      INFO("against one process");
      check_close(split.run, reference(name), p::kTolerance, p::kTolerance);
    }
    if (previous) {
      INFO("against the stage before, bitwise");
      check_bits(split.run, previous->run);
    }
    previous = split;
  }
}

TEST_CASE(
    "ZeRO-3 at dp2 x tp2, with and without SP: each rank's measured peak within 10% of "
    "the planner",
    "[mpi][zero3][memory]") {
  if (!four()) return;
  for (const char* layout :
       {"dp=2 tp=2 zero_stage=3", "dp=2 tp=2 zero_stage=3 sequence_parallel=true"}) {
    const modtrain::RunConfig cfg = test::tiny_recipe("tiny_mod", 1, layout);
    const double before = static_cast<double>(backend(Device::CPU).memory_stats().in_use_bytes);
    train::Trainer trainer(cfg, test::temp_dir("zero3_tp_mem"), /*quiet=*/true);
    trainer.run();
    const double measured = static_cast<double>(trainer.peak_memory_bytes()) - before;
    const double predicted = model::plan_memory(cfg).peak;
    std::printf("rank %d, tiny_mod [%s]: predicted %s, measured %s (%+.1f%%)\n",
                parallel::world().rank(), layout, model::format_bytes(predicted).c_str(),
                model::format_bytes(measured).c_str(), 100 * (predicted - measured) / measured);
    INFO(layout << ": predicted " << predicted << ", measured " << measured);
    CHECK(predicted == Approx(measured).epsilon(0.10));
  }
}
