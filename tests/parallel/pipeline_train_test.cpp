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
// bubble per stage inside (0, 1). tiny_mod under pp with train.recompute (FULL; SELECTIVE of
// blocks 2 and 3, one per stage) equals the pp run without it bitwise, in less memory on every
// stage; the MoDE recipes (MoE in every block) and tiny_mod with AUX_BCE (2 steps) train under
// pp as on one process, aux losses included. Each rank holds the bytes of only its stage's
// parameters (after the run, its weights and a resume), a read of another's names it, and
// keeping them all instead (the trainer before) is bitwise the same at a step peak higher by
// their bytes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_runtime.h"
#include "tests/support/bitwise.h"
#include "tests/support/metrics_csv.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"

using namespace mod;

namespace {
constexpr int kSteps = 4;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  size_t peak_memory_bytes = 0;  // this rank's, over the steps, above what it held before
  std::vector<double> aux_losses;
  // Each parameter's storage bytes on this rank after run() (which wrote the weights) and again
  // after full_parameters: under pp, the other stages' hold none.
  std::vector<size_t> held_bytes, held_bytes_after_full;
  std::string stray_read;  // what reading this rank's first released parameter threw ("": none)
};

std::vector<size_t> held_bytes(const train::Trainer& trainer) {
  std::vector<size_t> out;
  for (const auto& [name, p] : trainer.model().named_parameters())
    out.push_back(p.impl()->storage->bytes());
  return out;
}

Run train_run(const std::string& name, parallel::Communicator& comm, const std::string& dir,
              std::vector<std::string> extra, const std::string& from = "",
              const train::TestHooks& hooks = {}) {
  extra.insert(extra.end(), {"train.grad_accum=2", "checkpoint.every_steps=2"});
  const size_t before = backend(Device::CPU).memory_stats().in_use_bytes;  // earlier runs' results
  train::Trainer trainer(test::tiny_recipe(name, kSteps, "", extra), dir, /*quiet=*/true, comm,
                         hooks);
  if (!from.empty()) trainer.resume(from);
  trainer.run();
  const std::vector<size_t> held = held_bytes(trainer);
  std::string stray_read;
  for (const auto& [n, p] : trainer.model().named_parameters())
    if (p.impl()->storage->bytes() == 0) {
      try {
        p.to_vector();
        stray_read = "no error";
      } catch (const std::logic_error& e) {
        stray_read = e.what();
      }
      break;
    }
  // The measured bubble: under pp, one fraction per stage and their total, each inside (0, 1)
  // (every stage computes, and waits at least on a receive).
  const auto& bubble = trainer.measured_bubble();
  REQUIRE(bubble.has_value() == (trainer.mesh().dims().pp > 1));
  if (bubble) {
    CHECK(bubble->per_stage.size() == static_cast<size_t>(trainer.mesh().dims().pp));
    for (double b : bubble->per_stage) CHECK((b > 0 && b < 1));
    CHECK((bubble->total > 0 && bubble->total < 1));
  }
  Run out{trainer.losses(), trainer.full_parameters(), trainer.peak_memory_bytes() - before,
          trainer.aux_losses()};
  out.held_bytes = held;
  out.held_bytes_after_full = held_bytes(trainer);
  out.stray_read = stray_read;
  return out;
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

// Under pp each rank holds the bytes of exactly the parameters its stage owns (the tied
// embedding on both ends), after training, a resume and the weights' whole-model use alike.
void check_holds_own_stage(const Run& run, const std::string& name) {
  if (parallel::world().size() < 2) return;
  const modtrain::RunConfig cfg = test::tiny_recipe(name, kSteps, "", {pp_field()});
  const parallel::PipelinePartition part = parallel::plan_partition(cfg);
  const int rank = parallel::world().rank();
  REQUIRE(run.held_bytes.size() == run.params.size());
  std::string first_released;
  for (size_t i = 0; i < run.params.size(); ++i) {
    const std::string& n = run.params[i].first;
    const bool own = parallel::stage_owns(part, rank, n, cfg.model().tie_embeddings());
    INFO("pp rank " << rank << ", parameter " << n << (own ? " (owned)" : " (another stage's)"));
    CHECK(run.held_bytes[i] == (own ? run.params[i].second.nbytes() : 0));
    CHECK(run.held_bytes_after_full[i] == run.held_bytes[i]);
    if (!own && first_released.empty()) first_released = n;
  }
  // A read of the first parameter the rank does not hold throws, naming it.
  INFO("reading " << first_released << " said: " << run.stray_read);
  CHECK(!first_released.empty());
  CHECK_THAT(run.stray_read, Catch::Matchers::Contains(first_released + ",") &&
                                 Catch::Matchers::Contains("another pipeline stage"));
}

void check_bitwise(const Run& got, const Run& want) {
  test::check_bitwise(got.losses, want.losses);
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << want.params[i].first);
    test::check_bitwise(got.params[i].second.to_vector(), want.params[i].second.to_vector());
  }
}
// Each stage recomputes its own blocks: the same ops on the same values, so bitwise the pp run
// without recomputation (and so one process's bound), in less memory on every stage (a stage
// that kept its activations would show the plain run's peak). recompute_blocks [2, 3] at pp 2
// gives each stage one block (tiny_mod's stages are blocks 0-2 and 3-5).
void check_recompute(const std::string& name, const std::vector<std::string>& pp_set,
                     const Run& plain, const Run& one) {
  for (const std::vector<std::string>& recompute :
       {std::vector<std::string>{"train.recompute=FULL"},
        {"train.recompute=SELECTIVE", "train.recompute_blocks=[2, 3]"}}) {
    INFO(recompute.front() << " " << (recompute.size() > 1 ? recompute.back() : "") << ", stage "
                           << parallel::world().rank());
    std::vector<std::string> set = pp_set;
    set.insert(set.end(), recompute.begin(), recompute.end());
    const Run got = train_run(name, parallel::world(), test::shared_dir("pp_recompute"), set);
    check_bitwise(got, plain);
    check_close(got, one, 0);
    INFO("peak " << got.peak_memory_bytes << " bytes against " << plain.peak_memory_bytes
                 << " without recomputation");
    CHECK(got.peak_memory_bytes < plain.peak_memory_bytes);
    if (parallel::world().rank() == 0)
      std::printf("pp %d %s %s: stage 0 peak %.1f MiB against %.1f MiB without recomputation\n",
                  parallel::world().size(), recompute.front().c_str(),
                  recompute.size() > 1 ? recompute.back().c_str() : "",
                  got.peak_memory_bytes / 1048576.0, plain.peak_memory_bytes / 1048576.0);
  }
}

// What releasing the other stages' parameters saves, measured: the same pp run with every rank
// keeping the whole model (TestHooks::keep_other_stages_parameters, the trainer before) is
// bitwise the same and its step peak higher by the released bytes (each as the host allocator
// rounds it, 64 bytes or a 4 KiB page; a released storage keeps a 64-byte minimum).
void check_release_saves(const std::string& name, const std::vector<std::string>& pp_set,
                         const Run& released) {
  train::TestHooks keep;
  keep.keep_other_stages_parameters = true;
  const Run whole = train_run(name, parallel::world(), test::shared_dir("pp_whole"), pp_set, "", keep);
  check_bitwise(released, whole);
  double other_stages = 0, slack = 0;
  for (size_t i = 0; i < released.params.size(); ++i)
    if (released.held_bytes[i] == 0) {
      other_stages += static_cast<double>(whole.held_bytes[i]);
      slack += 4096;
    }
  const double saved = static_cast<double>(whole.peak_memory_bytes) -
                       static_cast<double>(released.peak_memory_bytes);
  INFO("pp rank " << parallel::world().rank() << ": peak " << released.peak_memory_bytes
                  << " bytes against " << whole.peak_memory_bytes << " holding every stage's; "
                  << "the other stages' parameters " << other_stages << " bytes");
  CHECK(other_stages > 0);
  CHECK(std::abs(saved - other_stages) <= slack);
  std::printf("pp %d %s, rank %d: step peak %.1f KiB, %.1f KiB holding every stage's parameters "
              "(the others' %.1f KiB)\n",
              parallel::world().size(), name.c_str(), parallel::world().rank(),
              released.peak_memory_bytes / 1024.0, whole.peak_memory_bytes / 1024.0,
              other_stages / 1024.0);
}
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
    check_holds_own_stage(pp, name);
    // The pp run's step-2 checkpoint, continued by one process on every rank.
    const std::string step2 = "/" + ckpt::step_dir_name(2);
    const Run resumed = train_run(name, test::self_group(), test::temp_dir("pp_resumed"), {},
                                  ckpt::checkpoints_dir(dir) + step2);
    check_close(resumed, pp, 2);
    // And the reverse: one process's step-2 checkpoint (each rank its own copy) under pp.
    const Run resumed_pp = train_run(name, parallel::world(), test::shared_dir("pp_resumed_pp"), pp_set,
                                     ckpt::checkpoints_dir(one_dir) + step2);
    check_close(resumed_pp, one, 2);
    check_holds_own_stage(resumed_pp, name);  // the load's whole values released again
    if (name == std::string("tiny_mod") && schedule == std::string("ONE_F_ONE_B")) {
      check_recompute(name, pp_set, pp, one);
      check_release_saves(name, pp_set, pp);
    }
  }
  // tiny_mod with AUX_BCE (each routed block's router trains on its own causal BCE, an aux
  // loss of the block's stage) under 1F1B for 2 steps: losses and parameters as above, and every
  // step's aux loss, summed over pp, to relative 1e-6 (f64 sums of f32 terms, in another order).
  {
    INFO("tiny_mod with AUX_BCE under ONE_F_ONE_B");
    const std::vector<std::string> aux = {"model.mod.causal.method=AUX_BCE", "train.steps=2"};
    const Run one = train_run("tiny_mod", test::self_group(), test::temp_dir("pp_one"), aux);
    std::vector<std::string> pp_set = aux;
    pp_set.insert(pp_set.end(), {pp_field(), "parallel.pp_schedule=ONE_F_ONE_B"});
    const Run pp = train_run("tiny_mod", parallel::world(), test::shared_dir("pp_run"), pp_set);
    check_close(pp, one, 0);
    REQUIRE(pp.aux_losses.size() == one.aux_losses.size());
    for (size_t s = 0; s < one.aux_losses.size(); ++s) {
      INFO("step " << s + 1 << ": aux loss " << pp.aux_losses[s] << " against " << one.aux_losses[s]);
      CHECK(one.aux_losses[s] != 0);
      CHECK(std::abs(pp.aux_losses[s] - one.aux_losses[s]) <= 1e-6 * std::abs(one.aux_losses[s]));
    }
  }
}

// Experts under pp: each MoE layer's experts live in its block's stage (ep 1 inside a stage).
// The MoDE recipes (expert-choice MoE in every block, with routed blocks: staged, and
// integrated with no-op experts) at pp 2 against one process for 2 steps: losses and
// parameters as above, and every step's aux loss (MoE balance and z losses, the predictors' BCE), which
// each stage computes for its own blocks and the trainer sums over pp, to relative 1e-6 (f64
// sums of the stages' f32 terms, in another order than one process's).
TEST_CASE("experts train under pp as on one process, their aux losses summed over the stages",
          "[mpi][pipeline][moe]") {
  if (parallel::world().size() != 2) return;  // every stage holds MoE blocks at pp 2
  for (const char* name : {"tiny_mode_staged", "tiny_mode_integrated"}) {
    INFO(name);
    const std::string steps = "train.steps=2";  // 2 steps of 2 micro-batches: CI time
    const Run one = train_run(name, test::self_group(), test::temp_dir("pp_moe_one"), {steps});
    const Run pp = train_run(name, parallel::world(), test::shared_dir("pp_moe"), {steps, pp_field()});
    check_close(pp, one, 0);
    REQUIRE(pp.aux_losses.size() == one.aux_losses.size());
    for (size_t s = 0; s < one.aux_losses.size(); ++s) {
      const double a = pp.aux_losses[s], b = one.aux_losses[s];
      INFO("step " << s + 1 << ": aux loss " << a << " against " << b);
      CHECK(b != 0);
      CHECK(std::abs(a - b) <= 1e-6 * std::abs(b));
    }
  }
}

// One evaluation (tiny_mod, 2 steps, eval_every 2: val_loss, every routed block's agreement,
// val_loss_causal) under pp reports what one process's does: every column one process writes
// sits at the same position in the pp run's metrics.csv (pp_bubble, which only pp has, last),
// and the losses and routing columns there agree to 1e-6 (relative, absolute below 1: the
// routers' means near 0 differ in their last f32 bits, measured 7e-7 relative).
TEST_CASE("pp: an evaluation reports one process's agreement and routing columns in its column "
          "order",
          "[mpi][pipeline]") {
  if (parallel::world().size() < 2) return;
  const std::vector<std::string> set = {"train.steps=2", "train.eval_every=2",
                                        "train.eval_batches=1", "model.d_model=64"};
  const std::string one_dir = test::temp_dir("pp_eval_one");
  const Run one = train_run("tiny_mod", test::self_group(), one_dir, set);
  std::vector<std::string> pp_set = set;
  pp_set.push_back(pp_field());
  const std::string dir = test::shared_dir("pp_eval");
  const Run pp = train_run("tiny_mod", parallel::world(), dir, pp_set);
  check_close(pp, one, 0);
  if (parallel::world().rank() != 0) return;  // world rank 0 writes metrics.csv
  const auto one_rows = test::metrics_rows(one_dir + "/metrics.csv");
  const auto pp_rows = test::metrics_rows(dir + "/metrics.csv");
  const std::vector<std::string>& one_header = one_rows.front();
  const std::vector<std::string>& one_row = one_rows.back();
  const std::vector<std::string>& pp_header = pp_rows.front();
  const std::vector<std::string>& pp_row = pp_rows.back();
  REQUIRE(pp_header.size() == one_header.size() + 1);
  CHECK(pp_header.back() == "pp_bubble");
  REQUIRE(one_row.size() == one_header.size());
  REQUIRE(pp_row.size() == pp_header.size());
  int agreements = 0;
  for (size_t i = 0; i < one_header.size(); ++i) {
    const std::string& name = one_header[i];
    INFO("column " << i + 1 << ": " << name << " (pp: " << pp_header[i] << ") " << pp_row[i]
                   << " against " << one_row[i]);
    REQUIRE(pp_header[i] == name);
    const bool timing = name == "tokens_per_s" || name == "mfu" || name == "peak_memory_mb";
    if (timing || name == "step") continue;
    REQUIRE(!one_row[i].empty());  // every column has a value at the evaluation step
    const double a = std::stod(pp_row[i]), b = std::stod(one_row[i]);
    CHECK(std::abs(a - b) <= 1e-6 * std::max(std::abs(b), 1.0));
    agreements += name.find("_agreement") != std::string::npos;
  }
  CHECK(agreements == 3);  // blocks 1, 3 and 5
}

// The partition by cost against Megatron's equal block count, measured: tiny_mod with its
// routed blocks last (3, 4, 5 at 12.5%) splits [2, 4] by FLOPs (slowest stage 1.14x the mean
// predicted) where [3, 3] puts the three dense blocks on stage 0 (1.71x). Measured per stage (one
// core a rank): 1.03-1.08x against 1.46-1.47x. CTest runs it alone on its two cores.
TEST_CASE("pp: the cost partition's measured stage times are closer to equal than an equal block "
          "count's",
          "[mpi][pipeline]") {
  if (parallel::world().size() != 2) return;  // one core a stage
  auto imbalance = [](const std::vector<std::string>& layout) {
    std::vector<std::string> sets = {"parallel.pp=2", "model.mod.schedule=EXPLICIT",
                                     "model.mod.routed_blocks=[3, 4, 5]", "model.seq_len=128",
                                     "train.batch_size=4", "train.grad_accum=2"};
    sets.insert(sets.end(), layout.begin(), layout.end());
    train::Trainer trainer(test::tiny_recipe("tiny_mod", kSteps, "", sets),
                           test::shared_dir("pp_balance"), /*quiet=*/true, parallel::world());
    trainer.run();
    const auto& compute = trainer.measured_bubble()->compute_s;
    REQUIRE(compute.size() == 2);
    for (double c : compute) CHECK(c > 0);
    return std::max(compute[0], compute[1]) * 2 / (compute[0] + compute[1]);
  };
  const double by_cost = imbalance({});
  const double by_count = imbalance({"parallel.pp_layout=[3, 3]"});
  INFO("slowest stage over the mean: by cost " << by_cost << ", by block count " << by_count);
  CHECK(by_cost + 0.1 < by_count);  // a clear margin: equal partitions would tie
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
  refused({"parallel.ep=2"}, "ep (2) must divide dp (1)");
  refused({"parallel.dp=2"}, "dp (2) x tp (1) x pp (" + std::to_string(parallel::world().size()) +
                                 ")");
  // Interleaving needs a whole number of micro-batch groups of pp (Megatron's condition).
  refused({"parallel.pp_schedule=INTERLEAVED_1F1B", "parallel.virtual_stages=2",
           "train.grad_accum=" + std::to_string(parallel::world().size() + 1)},
          "train.grad_accum: " + std::to_string(parallel::world().size() + 1) +
              " (micro-batches) must be a multiple of parallel.pp");
}
