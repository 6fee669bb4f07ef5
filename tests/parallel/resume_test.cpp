// Resume against a run that never stopped (docs/architecture.md section 5). A 20-step run checkpoints at
// step 10; a second trainer resumes from that checkpoint and runs steps 11-20.
// - Same layout: the resumed losses and final parameters are bitwise equal (tiny_dense, and
//   tiny_mod with its predictor; ZeRO-1 off and on).
// - Another layout (tp=2 -> dp=2 and back, under mpirun -np 2): equal to float tolerance, as in
//   the parity tests (relative 1e-5), since a layout only reorders sums; ZeRO-2 -> ZeRO-1 at
//   dp=2 bitwise (the same sums).
// - MoDE: experts saved split over ep=2 resume under ep=1 (every rank reads all experts), and
//   the reverse, with ZeRO-1 moments gathered over the expert data-parallel group.
#include <cstring>

#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"

using namespace mod;

namespace {
constexpr int kSteps = 20;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  std::string dir;
};

// Trains `layout` from scratch (checkpointing every 10 steps) or, with from non-empty, resumes
// from that checkpoint.
Run train_run(const std::string& name, const std::string& layout, const std::string& from = "") {
  const auto cfg = test::tiny_recipe(name, kSteps, layout, {"checkpoint.every_steps=10"});
  Run r;
  // Every rank of the job must use rank 0's run directory: broadcast its name's random suffix.
  std::string dir = test::temp_dir("resume_run");
  Tensor chars = Tensor::zeros({256}, DType::I32);
  for (size_t i = 0; i < dir.size() && i < 255; ++i) chars.data<int32_t>()[i] = dir[i];
  parallel::world().broadcast(chars, 0);
  r.dir.clear();
  for (int i = 0; i < 256 && chars.data<int32_t>()[i]; ++i) r.dir += static_cast<char>(chars.data<int32_t>()[i]);
  train::Trainer trainer(cfg, r.dir, /*quiet=*/true);
  if (!from.empty()) trainer.resume(from);
  CHECK(trainer.start_step() == (from.empty() ? 0 : 10));
  trainer.run();
  r.losses = trainer.losses();
  r.params = trainer.full_parameters();
  return r;
}

std::string step10(const Run& r) { return ckpt::checkpoints_dir(r.dir) + "/" + ckpt::step_dir_name(10); }

void check_resume(const std::string& name, const std::string& saved_layout,
                  const std::string& resumed_layout, bool bitwise) {
  INFO(name << ": saved under '" << saved_layout << "', resumed under '" << resumed_layout << "'");
  const Run whole = train_run(name, saved_layout);
  REQUIRE(whole.losses.size() == static_cast<size_t>(kSteps));
  const Run resumed = train_run(name, resumed_layout, step10(whole));
  REQUIRE(resumed.losses.size() == static_cast<size_t>(kSteps - 10));
  for (size_t s = 0; s < resumed.losses.size(); ++s) {
    const double want = whole.losses[10 + s], got = resumed.losses[s];
    INFO("step " << 11 + s << ": resumed " << got << ", uninterrupted " << want);
    if (bitwise)
      CHECK(got == want);
    else
      CHECK(std::abs(got - want) <= 1e-5 * std::abs(want));
  }
  REQUIRE(resumed.params.size() == whole.params.size());
  for (size_t i = 0; i < whole.params.size(); ++i) {
    INFO("parameter " << whole.params[i].first);
    const Tensor& a = resumed.params[i].second;
    const Tensor& b = whole.params[i].second;
    if (bitwise)
      CHECK(std::memcmp(a.raw_data(), b.raw_data(), b.nbytes()) == 0);
    else
      CHECK(test::relative_norm_diff(a, b) < 1e-5);
  }
}
}  // namespace

TEST_CASE("resume is exact in the same layout, ZeRO-1 off and on", "[mpi][resume]") {
  const int n = parallel::world().size();
  const std::string dp = "dp=" + std::to_string(n);
  for (const char* name : {"tiny_dense", "tiny_mod"}) {
    check_resume(name, dp, dp, /*bitwise=*/true);
    check_resume(name, dp + " zero1=true", dp + " zero1=true", /*bitwise=*/true);
  }
}

TEST_CASE("a checkpoint saved under one layout resumes under another", "[mpi][resume]") {
  if (parallel::world().size() != 2) return;  // needs two ranks: tp=2 <-> dp=2
  check_resume("tiny_mod", "tp=2", "dp=2", /*bitwise=*/false);
  check_resume("tiny_mod", "dp=2 zero1=true", "tp=2", /*bitwise=*/false);
  // ZeRO-2 saves what ZeRO-1 saves (moments gathered, parameters whole) and reduces alike.
  check_resume("tiny_mod", "dp=2 zero_stage=2", "dp=2 zero_stage=1", /*bitwise=*/true);
  check_resume("tiny_dense", "dp=2", "tp=2", /*bitwise=*/false);
}

TEST_CASE("MoDE checkpoints store experts by global index: ep=2 <-> ep=1", "[mpi][resume]") {
  if (parallel::world().size() != 2) return;  // ep=2 needs dp=2
  check_resume("tiny_mode_integrated", "dp=2 ep=2", "dp=2 ep=2", /*bitwise=*/true);
  check_resume("tiny_mode_integrated", "dp=2 ep=2", "dp=2", /*bitwise=*/false);
  check_resume("tiny_mode_staged", "dp=2", "dp=2 ep=2 zero1=true", /*bitwise=*/false);
  check_resume("tiny_mode_staged", "dp=2 ep=2 zero1=true", "tp=2", /*bitwise=*/false);
}
