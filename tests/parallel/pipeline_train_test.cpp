// The trainer under parallel.pp = world size against one process (what `modtrain train` runs
// under mpirun): tiny_dense and tiny_mod (with its causal predictor, clipped apart) for 4 steps
// of 2 micro-batches, every stage reading the same batches. The language-model loss takes the
// same ops in the same order; the gradient norm sums the stages' squares over pp (another
// association than one process's single pass), so clipping may differ in the last bit:
// losses and parameters agree to relative 1e-6 (measured: parameters 2.4e-7 in norm; every
// loss bitwise but tiny_dense's fourth, equal to 6 digits). A pp run's checkpoint (each stage
// writes what it owns, by global name) resumes on one process and continues like the
// uninterrupted pp run, and one process's checkpoint resumes under pp. Configurations the
// pipeline trainer does not run are refused naming the fields. Every pp run reports a measured
// bubble per stage inside (0, 1).
#include <cmath>

#include "parallel/communicator.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"

using namespace mod;

namespace {
constexpr int kSteps = 4;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
};

Run train_run(const std::string& name, parallel::Communicator& comm, const std::string& dir,
              std::vector<std::string> extra, const std::string& from = "") {
  extra.insert(extra.end(), {"train.grad_accum=2", "checkpoint.every_steps=2"});
  train::Trainer trainer(test::tiny_recipe(name, kSteps, "", extra), dir, /*quiet=*/true, comm);
  if (!from.empty()) trainer.resume(from);
  trainer.run();
  // The measured bubble: under pp, one fraction per stage and their total, each inside (0, 1)
  // (every stage computes, and waits at least on a receive).
  const auto& bubble = trainer.measured_bubble();
  REQUIRE(bubble.has_value() == (trainer.mesh().dims().pp > 1));
  if (bubble) {
    CHECK(bubble->per_stage.size() == static_cast<size_t>(trainer.mesh().dims().pp));
    for (double b : bubble->per_stage) CHECK((b > 0 && b < 1));
    CHECK((bubble->total > 0 && bubble->total < 1));
  }
  return {trainer.losses(), trainer.full_parameters()};
}

void check_close(const Run& got, const Run& want, size_t first_step) {
  REQUIRE(got.losses.size() + first_step == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    const double a = got.losses[s], b = want.losses[first_step + s];
    INFO("step " << first_step + s + 1 << ": " << a << " against " << b);
    CHECK(std::abs(a - b) <= 1e-6 * std::abs(b));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << want.params[i].first);
    CHECK(test::relative_norm_diff(got.params[i].second, want.params[i].second) < 1e-6);
  }
}

std::string pp_field() { return "parallel.pp=" + std::to_string(parallel::world().size()); }
}  // namespace

TEST_CASE("pp = world size trains as one process and resumes on one process", "[mpi][pipeline]") {
  if (parallel::world().size() < 2) return;  // pp needs two ranks
  for (const auto& [name, schedule] : {std::pair{"tiny_dense", "ONE_F_ONE_B"},
                                       std::pair{"tiny_mod", "ONE_F_ONE_B"},
                                       std::pair{"tiny_mod", "GPIPE"}}) {
    INFO(name << " under " << schedule);
    const std::string one_dir = test::temp_dir("pp_one");
    const Run one = train_run(name, test::self_group(), one_dir, {});
    const std::string dir = test::shared_dir("pp_run");
    const std::vector<std::string> pp_set = {pp_field(), std::string("parallel.pp_schedule=") + schedule};
    const Run pp = train_run(name, parallel::world(), dir, pp_set);
    check_close(pp, one, 0);
    // The pp run's step-2 checkpoint, continued by one process on every rank.
    const std::string step2 = "/" + ckpt::step_dir_name(2);
    const Run resumed = train_run(name, test::self_group(), test::temp_dir("pp_resumed"), {},
                                  ckpt::checkpoints_dir(dir) + step2);
    check_close(resumed, pp, 2);
    // And the reverse: one process's step-2 checkpoint (each rank its own copy) under pp.
    const Run resumed_pp = train_run(name, parallel::world(), test::shared_dir("pp_resumed_pp"), pp_set,
                                     ckpt::checkpoints_dir(one_dir) + step2);
    check_close(resumed_pp, one, 2);
  }
}

TEST_CASE("pp refuses what the pipeline trainer does not run, naming the fields", "[mpi][pipeline]") {
  if (parallel::world().size() < 2) return;
  auto refused = [](std::vector<std::string> extra, const std::string& field) {
    extra.push_back(pp_field());
    INFO("expected an error naming " << field);
    try {
      train::Trainer t(test::tiny_recipe("tiny_dense", 1, "", extra), test::temp_dir("pp_bad"),
                       /*quiet=*/true);
      FAIL("not refused");
    } catch (const std::invalid_argument& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains(field));
    }
  };
  refused({"parallel.ep=2"}, "parallel.ep");
  refused({"parallel.dp=2"}, "dp (2) x tp (1) x pp (" + std::to_string(parallel::world().size()) +
                                 ")");
  refused({"parallel.zero1=true"}, "parallel.zero_stage 1");
  refused({"parallel.sequence_parallel=true"}, "parallel.sequence_parallel");
  refused({"train.recompute=FULL"}, "train.recompute");
  // Interleaving needs a whole number of micro-batch groups of pp (Megatron's condition).
  refused({"parallel.pp_schedule=INTERLEAVED_1F1B", "parallel.virtual_stages=2",
           "train.grad_accum=" + std::to_string(parallel::world().size() + 1)},
          "train.grad_accum: " + std::to_string(parallel::world().size() + 1) +
              " (micro-batches) must be a multiple of parallel.pp");
}
