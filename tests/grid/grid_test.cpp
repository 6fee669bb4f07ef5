// isoFLOP grids: expansion spends each budget to within one step's FLOPs, point names are
// stable, invalid specs fail naming the field, skipped points carry their reason; the recipes
// load; the job-array script and the run-directory inspection.
#include <google/protobuf/text_format.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/util/safetensors.h"
#include "grid/expand.h"
#include "grid/results.h"
#include "grid/run_state.h"
#include "grid/sbatch.h"
#include "grid/spec.h"
#include "train/weights.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
const std::string kTiny = MOD_SOURCE_DIR "/tests/grid/tiny_grid.textproto";
const std::string kGrids = MOD_SOURCE_DIR "/configs/grids/";

modtrain::GridSpec tiny() { return grid::load_grid(kTiny); }

// The tiny spec with `extra` merged in (scalars replace, messages merge, repeated fields
// append), validated as "tiny_grid+".
modtrain::GridSpec tiny_with(const std::string& extra) {
  std::ifstream in(kTiny);
  std::stringstream ss;
  ss << in.rdbuf();
  auto spec = grid::parse_grid_text(ss.str(), kTiny);
  REQUIRE(google::protobuf::TextFormat::MergeFromString(extra, &spec));
  grid::validate_grid(spec, "tiny_grid+");
  return spec;
}

std::string fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("grid_test_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}
}  // namespace

TEST_CASE("expansion spends each budget to within one step's FLOPs", "[grid]") {
  const auto spec = tiny();
  const auto points = grid::expand(spec);
  REQUIRE(points.size() == 8);
  for (const auto& p : points) {
    INFO(p.name);
    REQUIRE_FALSE(p.skipped());
    const auto f = model::count_flops(p.config.model());
    const double per_step = f.training_per_token * static_cast<double>(p.tokens_per_step);
    CHECK(p.config.train().steps() == p.steps);
    CHECK(p.tokens_per_step == p.config.train().batch_size() * p.config.model().seq_len());
    CHECK(p.flops_spent == Approx(static_cast<double>(p.steps) * per_step));
    CHECK(p.flops_spent <= p.budget);
    CHECK(p.budget - p.flops_spent < per_step);
    CHECK(p.steps >= spec.min_steps());
    // warmup_fraction 0.1 of the point's steps.
    CHECK(p.config.optimizer().warmup_steps() == std::llround(0.1 * static_cast<double>(p.steps)));
  }
  // The point's config is the base with the shape and variant applied.
  const auto& p = points[3];  // b2e10_s2_mod
  CHECK(p.config.name() == "b2e10_s2_mod");
  CHECK(p.config.model().d_model() == 64);
  CHECK(p.config.model().d_ff() == 128);
  CHECK(p.config.model().mod().enabled());
  CHECK(p.config.model().mod().capacity() == Approx(0.125));
  CHECK(p.config.train().batch_size() == 4);
  CHECK(p.config.checkpoint().every_steps() == 100);
  CHECK_FALSE(points[2].config.model().mod().enabled());  // b2e10_s2_dense
  // MoD spends fewer FLOPs per token, so the same budget buys more steps.
  CHECK(points[3].steps > points[2].steps);
  // Doubling the budget doubles the steps, give or take the rounding down.
  CHECK(std::abs(points[7].steps - 2 * points[3].steps) <= 1);
}

TEST_CASE("point names are stable: budget, shape and variant in spec order", "[grid]") {
  const auto points = grid::expand(tiny());
  const std::vector<std::string> expected = {"b2e10_s1_dense", "b2e10_s1_mod", "b2e10_s2_dense",
                                             "b2e10_s2_mod",   "b4e10_s1_dense", "b4e10_s1_mod",
                                             "b4e10_s2_dense", "b4e10_s2_mod"};
  for (size_t i = 0; i < points.size(); ++i) {
    CHECK(points[i].name == expected[i]);
    CHECK(points[i].array_index == static_cast<int>(i));
  }
  CHECK(grid::budget_label(6e18) == "6e18");
  CHECK(grid::budget_label(2e19) == "2e19");
  CHECK(grid::budget_label(1e20) == "1e20");
  CHECK(grid::budget_label(1e13) == "1e13");
  CHECK(grid::budget_label(2.5e13) == "2.5e13");
  CHECK(grid::budget_label(1.25e12) == "1.25e12");
  CHECK(grid::budget_label(9.999e12) == "1e13");
  CHECK(grid::budget_label(3e12) == "3e12");
  // Expanding again gives the same points and steps.
  const auto again = grid::expand(tiny());
  for (size_t i = 0; i < points.size(); ++i) {
    CHECK(again[i].name == points[i].name);
    CHECK(again[i].steps == points[i].steps);
  }
}

TEST_CASE("skipped points carry their reason and take no array index", "[grid]") {
  SECTION("too few steps") {
    // s2 at 2e10 buys 144 (dense) and 211 (MoD) steps; min_steps 200 drops the dense one.
    const auto points = grid::expand(tiny_with("min_steps: 200"));
    const auto& p = points[2];
    REQUIRE(p.name == "b2e10_s2_dense");
    CHECK(p.skipped());
    CHECK_THAT(p.skip_reason, Contains("144 steps") && Contains("min_steps 200"));
    CHECK(p.array_index == -1);
    CHECK(points[3].array_index == 2);  // the next runnable point
    int runnable = 0;
    for (const auto& q : points) runnable += !q.skipped();
    CHECK(points.back().array_index == runnable - 1);
  }
  SECTION("a config that is invalid for one shape only") {
    // Block 2 exists in a 3-layer shape, not in the 2-layer ones.
    const auto points = grid::expand(tiny_with(
        "shapes { name: \"deep\" d_model: 32 n_layers: 3 n_heads: 2 d_ff: 64 }\n"
        "variants { name: \"b2\" mod { enabled: true schedule: EXPLICIT routed_blocks: [2] } }"));
    int skipped = 0;
    for (const auto& p : points) {
      INFO(p.name);
      if (p.variant == "b2" && p.shape != "deep") {
        CHECK(p.skipped());
        CHECK_THAT(p.skip_reason, Contains("invalid config") && Contains("model.mod.routed_blocks[0]"));
        ++skipped;
      } else {
        CHECK_FALSE(p.skipped());
      }
    }
    CHECK(skipped == 4);  // 2 budgets x 2 shallow shapes
  }
  SECTION("a shape override that makes the config invalid") {
    const auto points = grid::expand(tiny_with(
        "shapes { name: \"s3\" d_model: 32 n_layers: 2 n_heads: 2 d_ff: 64 overrides: \"optimizer.min_lr=1\" }"));
    for (const auto& p : points)
      if (p.shape == "s3") CHECK_THAT(p.skip_reason, Contains("optimizer.min_lr"));
  }
}

TEST_CASE("invalid grid specs fail with the file and the field", "[grid][errors]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"budgets: [-1]", {"budgets[2]", "positive"}},
      {"budgets: [2.01e10]", {"budgets[2]", "within 1%"}},
      {"shapes { name: \"s1\" d_model: 8 n_layers: 1 n_heads: 2 d_ff: 8 }", {"shapes[2].name", "two shapes"}},
      {"shapes { name: \"big_one\" d_model: 8 n_layers: 1 n_heads: 2 d_ff: 8 }", {"shapes[2].name", "no '_'"}},
      {"shapes { name: \"s3\" d_model: 30 n_layers: 1 n_heads: 4 d_ff: 8 }", {"shapes[2].n_heads", "do not divide"}},
      {"shapes { name: \"s3\" d_model: 32 n_layers: 1 n_heads: 2 }", {"shapes[2].d_ff", "missing"}},
      {"shapes { name: \"s3\" d_model: 32 n_layers: 0 n_heads: 2 d_ff: 8 }", {"shapes[2].n_layers", "positive"}},
      {"shapes { name: \"s3\" d_model: 32 n_layers: 1 n_heads: 2 d_ff: 8 overrides: \"model.d_modl=3\" }",
       {"shapes[2].overrides[0]", "model.d_modl", "unknown field"}},
      {"variants { name: \"half\" mod { enabled: true capacity: 1.5 } }", {"variants[2].mod.capacity", "(0, 1]"}},
      {"variants { name: \"dense\" }", {"variants[2].name", "two variants"}},
      {"base { optimizer { lr: -1 } }", {"base.optimizer.lr", "positive"}},
      {"base { train { batch_size: 0 } }", {"base.train.batch_size", "positive"}},
      {"min_steps: 0", {"min_steps", ">= 1"}},
      {"warmup_fraction: 1.5", {"warmup_fraction", "[0, 1)"}},
      {"slurm { ntasks: 4 }", {"slurm.ntasks", "base.parallel.dp 1 x base.parallel.tp 1"}},
      {"slurm { time_limit: \"two hours\" }", {"slurm.time_limit", "Slurm time"}},
      {"slurm { extra_sbatch: \"exclusive\" }", {"slurm.extra_sbatch[0]", "long option"}},
      {"extra_seeds: [1337]", {"extra_seeds[0]", "1337 repeats base.train.seed"}},
      {"extra_seeds: [2, 2]", {"extra_seeds[1]", "repeats"}},
      {"seed_budgets: [2e10]", {"seed_budgets", "without extra_seeds"}},
      {"extra_seeds: [2] seed_budgets: [3e10]", {"seed_budgets[0]", "3e+10 is not one of budgets"}},
  };
  for (const auto& [extra, words] : cases) {
    INFO(extra);
    try {
      tiny_with(extra);
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      INFO(what);
      CHECK_THAT(what, Contains("grid spec tiny_grid+"));
      for (const auto& w : words) CHECK_THAT(what, Contains(w));
    }
  }
  // Empty lists and a missing name.
  CHECK_THROWS_WITH(grid::validate_grid(modtrain::GridSpec(), "empty.textproto"),
                    Contains("empty.textproto") && Contains("name"));
  auto no_budgets = tiny();
  no_budgets.clear_budgets();
  CHECK_THROWS_WITH(grid::validate_grid(no_budgets, "f"), Contains("budgets") && Contains("none given"));
  // Syntax errors and unknown fields name the file and line.
  CHECK_THROWS_WITH(grid::parse_grid_text("name: \"x\"\nbudget: [1e12]\n", "bad.textproto"),
                    Contains("bad.textproto:2") && Contains("budget"));
  CHECK_THROWS_WITH(grid::load_grid("/nonexistent/grid.textproto"), Contains("/nonexistent/grid.textproto"));
}

// A label or time limit of a million characters once overflowed the stack inside std::regex.
TEST_CASE("a million-character label, grid name or time limit is refused, quoted short",
          "[grid][errors]") {
  const std::string huge(1000000, 'a');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"shapes { name: \"" + huge + "\" d_model: 32 n_layers: 1 n_heads: 2 d_ff: 8 }",
       "shapes[2].name"},
      {"variants { name: \"" + huge + "\" }", "variants[2].name"},
      {"name: \"" + huge + "\"", "name"},
      {"slurm { time_limit: \"" + std::string(1000000, '1') + "\" }", "slurm.time_limit"},
      {"slurm { time_limit: \"1:" + std::string(1000000, ':') + "\" }", "slurm.time_limit"},
  };
  for (const auto& [extra, field] : cases) {
    INFO(field);
    try {
      tiny_with(extra);
      FAIL("no error");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Contains("grid spec tiny_grid+: " + field + ": '"));
      CHECK_THAT(what, Contains("(1000000 characters)") || Contains("(1000002 characters)"));
      CHECK(what.size() < 400);
    }
  }
  // The longest label still passes; the Slurm time forms pass, their near misses do not.
  CHECK(grid::valid_grid_label(std::string(grid::kMaxGridLabelChars, 'x')));
  CHECK_FALSE(grid::valid_grid_label(std::string(grid::kMaxGridLabelChars + 1, 'x')));
  CHECK_FALSE(grid::valid_grid_label(""));
  for (const char* ok : {"30", "30:00", "04:00:00", "2-00", "2-04:00", "2-04:00:00"}) {
    INFO(ok);
    CHECK_NOTHROW(tiny_with(std::string("slurm { time_limit: \"") + ok + "\" }"));
  }
  for (const char* bad : {"", "-1", "2-", "1:2:3:4", "4:", ":4", "1-2-3", "2-04:00:00 "}) {
    INFO(bad);
    CHECK_THROWS_WITH(tiny_with(std::string("slurm { time_limit: \"") + bad + "\" }"),
                      Contains("slurm.time_limit"));
  }
}

TEST_CASE("every grid in configs/grids loads and expands", "[grid]") {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kGrids)) {
    if (entry.path().extension() != ".textproto") continue;
    INFO(entry.path());
    const auto spec = grid::load_grid(entry.path().string());
    const auto points = grid::expand(spec);
    size_t expected = 0;  // budgets x shapes x variants, times the seeds of each budget
    for (int b = 0; b < spec.budgets_size(); ++b)
      expected += static_cast<size_t>(spec.shapes_size() * spec.variants_size()) *
                  (grid::has_extra_seeds(spec, b) ? 1 + spec.extra_seeds_size() : 1);
    CHECK(points.size() == expected);
    int runnable = 0;
    for (const auto& p : points) runnable += !p.skipped();
    CHECK(runnable > 0);
    ++n;
  }
  CHECK(n >= 2);
  // The paper-like grid: 60M .. 3B dense parameters, every point runnable. Integrated MoDE
  // (8 experts, 12.5% of tokens on them) has more parameters but fewer FLOPs per token than
  // dense, so at the same budget and shape it trains more steps.
  const auto paper = grid::expand(grid::load_grid(kGrids + "paper_gpu.textproto"));
  int64_t smallest = INT64_MAX, largest = 0;
  std::map<std::string, const grid::GridPoint*> dense;  // by budget and shape
  int mode_points = 0;
  for (const auto& p : paper) {
    CHECK_FALSE(p.skipped());
    if (p.config.model().moe().enabled()) continue;
    smallest = std::min(smallest, p.flops.parameters);
    largest = std::max(largest, p.flops.parameters);
    if (!p.routed) dense[std::to_string(p.budget) + "/" + std::to_string(p.shape_index)] = &p;
  }
  for (const auto& p : paper) {
    if (!p.config.model().moe().noop_expert()) continue;
    const grid::GridPoint* d = dense.at(std::to_string(p.budget) + "/" + std::to_string(p.shape_index));
    CHECK(p.flops.parameters > 4 * d->flops.non_embedding_parameters);
    CHECK(p.flops.training_per_token < d->flops.training_per_token);
    CHECK(p.steps > d->steps);
    ++mode_points;
  }
  CHECK(mode_points == 21);  // 3 budgets x 7 shapes
  CHECK(smallest == Approx(60e6).epsilon(0.1));
  CHECK(largest == Approx(3e9).epsilon(0.1));
}

TEST_CASE("extra seeds rerun every point of their budgets, named by seed, after the base seed",
          "[grid]") {
  const auto spec = tiny_with("extra_seeds: [2, 3] seed_budgets: [4e10]");
  const auto points = grid::expand(spec);
  REQUIRE(points.size() == 4 + 4 * 3);  // 2e10: 2 shapes x 2 variants; 4e10: each 3 times
  std::vector<std::string> names;
  int index = 0;
  for (const auto& p : points) {
    names.push_back(p.name);
    CHECK(p.config.train().seed() == p.seed);
    CHECK(p.config.name() == p.name);
    if (!p.skipped()) CHECK(p.array_index == index++);
  }
  CHECK(names[0] == "b2e10_s1_dense");
  CHECK(names[1] == "b2e10_s1_mod");
  CHECK(names[4] == "b4e10_s1_dense");
  CHECK(names[5] == "b4e10_s1_dense_s2");
  CHECK(names[6] == "b4e10_s1_dense_s3");
  CHECK(names[7] == "b4e10_s1_mod");
  CHECK(names[15] == "b4e10_s2_mod_s3");
  CHECK(points[4].seed == 1337);  // the base seed keeps the name it had without extra seeds
  CHECK(points[4].seed_index == 0);
  CHECK(points[5].seed == 2);
  CHECK(points[6].seed_index == 2);
  // A seed changes nothing but the seed: the same steps, FLOPs and warm-up.
  for (int k : {5, 6}) {
    CHECK(points[k].steps == points[4].steps);
    CHECK(points[k].config.optimizer().warmup_steps() == points[4].config.optimizer().warmup_steps());
    auto a = points[k].config, b = points[4].config;
    a.mutable_train()->clear_seed();
    b.mutable_train()->clear_seed();
    a.clear_name();
    b.clear_name();
    CHECK(a.SerializeAsString() == b.SerializeAsString());
  }
  // Without seed_budgets, every budget gets them.
  CHECK(grid::expand(tiny_with("extra_seeds: [7]")).size() == 16);
  CHECK(grid::expand(tiny()).size() == 8);
}

TEST_CASE("points group over their seeds: the mean, range and causal mean of finished ones",
          "[grid]") {
  const auto points = grid::expand(tiny_with("extra_seeds: [2, 3] seed_budgets: [4e10]"));
  std::vector<grid::PointResult> results(points.size());
  for (size_t i = 0; i < points.size(); ++i) results[i].point = &points[i];
  // b2e10_s1_dense: one seed, finished. b4e10_s1_mod (index 7..9): seeds 1337 and 3 finished,
  // 2 not; each with a causal loss. Every other point: not finished.
  results[0].val_loss = 2.5;
  results[7].val_loss = 2.0;
  results[7].causal_val_loss = 2.1;
  results[9].val_loss = 2.4;
  results[9].causal_val_loss = 2.3;
  const auto groups = grid::group_by_seed(results);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].point->name == "b2e10_s1_dense");
  CHECK(groups[0].results.size() == 1);
  CHECK(groups[0].mean() == 2.5);
  CHECK_FALSE(groups[0].causal_mean());
  CHECK(groups[1].point->name == "b4e10_s1_mod");
  CHECK(groups[1].results.size() == 3);
  CHECK(groups[1].losses.size() == 2);
  CHECK(groups[1].mean() == Approx(2.2));
  CHECK(groups[1].min() == 2.0);
  CHECK(groups[1].max() == 2.4);
  REQUIRE(groups[1].causal_mean());
  CHECK(*groups[1].causal_mean() == Approx(2.2));
}

TEST_CASE("the job-array script has one task per runnable point", "[grid]") {
  const auto spec = tiny();
  const auto points = grid::expand(spec);
  std::vector<const grid::GridPoint*> runnable;
  for (const auto& p : points) runnable.push_back(&p);
  const std::string s = grid::sbatch_script(spec, runnable, {"/o", "/w", "/bin/modtrain", "spec"});
  for (const char* line : {"#SBATCH --array=0-7%2\n", "#SBATCH --requeue\n", "#SBATCH --signal=USR1@60\n",
                           "#SBATCH --time=00:10:00\n", "#SBATCH --cpus-per-task=1\n",
                           "#SBATCH --output=/o/logs/task_%a.out\n", "#SBATCH --error=/o/logs/task_%a.err\n",
                           "--run-dir \"$run\" --resume auto", "--config \"$out/points/$name.textproto\"",
                           "b2e10_s1_dense b2e10_s1_mod", "cd '/w'"})
    CHECK_THAT(s, Contains(line));
  // The requeue protocol is sourced from the copy of cluster/modtrain_job.sh beside the script,
  // never retyped into it; the copy is that file as built into the program.
  for (const char* line : {"\nsource \"$out/modtrain_job.sh\" || exit 2\n",
                           "\nmod_run_step srun \"$modtrain\" train --config",
                           "\nmod_finish_job \"$mod_rc\"\n"})
    CHECK_THAT(s, Contains(line));
  for (const char* retyped : {"trap ", "wait ", "kill ", "scontrol", "-eq 75"})
    CHECK_THAT(s, !Contains(retyped));
  std::ifstream job_sh(MOD_SOURCE_DIR "/cluster/modtrain_job.sh");
  std::stringstream job_text;
  job_text << job_sh.rdbuf();
  CHECK(grid::job_protocol_script() == job_text.str());
  CHECK_THAT(job_text.str(), Contains("scontrol requeue") && Contains("mod_run_step()"));
  CHECK_THAT(s, !Contains("--account") && !Contains("--partition") && !Contains("--gpus"));
  // Optional settings appear when given.
  auto full = tiny_with(
      "slurm { partition: \"gpu\" account: \"proj\" gpus_per_task: 1 mem: \"64G\" "
      "setup: \"module load openmpi\" srun_args: \"--mpi=pmix\" extra_sbatch: \"--exclusive\" }");
  const std::string f = grid::sbatch_script(full, runnable, {"/o", "/w", "/bin/modtrain", "spec"});
  for (const char* line : {"#SBATCH --partition=gpu\n", "#SBATCH --account=proj\n", "#SBATCH --gpus-per-task=1\n",
                           "#SBATCH --mem=64G\n", "#SBATCH --exclusive\n", "\nmodule load openmpi\n",
                           "srun --mpi=pmix \"$modtrain\" train"})
    CHECK_THAT(f, Contains(line));
  CHECK(grid::array_range(8, 0) == "0-7");
  CHECK(grid::array_range(1, 3) == "0-0%3");
  CHECK_THROWS_WITH(grid::sbatch_script(spec, {}, {"/o", "/w", "/m", "s"}), Contains("no runnable points"));
}

TEST_CASE("a run directory's state: weights step, checkpoint, final validation loss", "[grid]") {
  const std::string dir = fresh_dir("state");
  CHECK(grid::inspect_run(dir + "/missing", 10, 256).status == grid::RunStatus::NotStarted);
  CHECK(grid::inspect_run(dir, 10, 256).status == grid::RunStatus::NotStarted);

  {  // interrupted after step 7, last checkpoint at step 5; a torn last line
    std::ofstream m(dir + "/metrics.csv");
    m << "step,loss,lm_loss,val_loss,tokens_per_s\n";
    for (int s = 1; s <= 7; ++s) m << s << ",3,3," << (s == 5 ? "2.5" : "") << ",256\n";
    m << "8,2.9";
  }
  std::filesystem::create_directories(dir + "/checkpoints");
  std::ofstream(dir + "/checkpoints/latest") << "step_00000005\n";
  auto st = grid::inspect_run(dir, 10, 256);
  CHECK(st.status == grid::RunStatus::Partial);
  CHECK(st.checkpoint_step == 5);
  CHECK(st.metrics_step == 8);
  CHECK_FALSE(st.final_val_loss);
  CHECK(st.train_seconds == Approx(7.0));
  CHECK(st.describe() == "partial: checkpoint at step 5, metrics to step 8");
  CHECK(st.details() == "checkpoint at step 5, metrics to step 8");  // collect's note

  {  // finished: rows to step 10 with a validation loss there, and the weights file at step 10
    std::ofstream m(dir + "/metrics.csv");
    m << "step,loss,lm_loss,val_loss,tokens_per_s\n";
    for (int s = 1; s <= 10; ++s) m << s << ",3,3," << (s == 10 ? "2.25" : "") << ",256\n";
  }
  save_safetensors(dir + "/model.safetensors", {{"w", Tensor::zeros({2, 2})}},
                   {{"format", "modtrain-weights-1"}, {"config", "name: \"x\""}, {"step", "10"}});
  CHECK(train::weights_step(dir + "/model.safetensors") == 10);
  st = grid::inspect_run(dir, 10, 256);
  CHECK(st.status == grid::RunStatus::Finished);
  REQUIRE(st.final_val_loss);
  CHECK(*st.final_val_loss == Approx(2.25));
  // The same directory for a point that wants 12 steps (the spec changed): not finished.
  st = grid::inspect_run(dir, 12, 256);
  CHECK(st.status == grid::RunStatus::Partial);
  CHECK_THAT(st.describe(), Contains("model.safetensors at step 10"));
  // A safetensors file that is not modtrain's.
  save_safetensors(dir + "/other.safetensors", {{"w", Tensor::zeros({1})}}, {{"step", "3"}});
  CHECK(train::weights_step(dir + "/other.safetensors") == -1);
  std::filesystem::remove_all(dir);
}
