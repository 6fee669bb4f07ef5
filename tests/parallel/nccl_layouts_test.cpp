// Every parallel layout on the GPU path, its device tensors crossing ranks through NCCL: what a
// multi-GPU job runs. Built against the emulated twins (nccl_layouts_tests_emulated: our kernels
// on the SIMT emulator, NCCL's stand-in between processes), so it runs in CI without a GPU; on
// GPUs the same source would run as is. Each layout's run is compared with the same layout on
// the CPU as gpu_training_tests compares one GPU with the CPU (f32: every step's loss within
// 1e-3 relative), and the graphed run with the eager one (within 1e-5 relative: the same
// kernels, the collectives captured in the graph and run at every replay). At the emulator's
// scale (tests/cuda_training/gpu_training_test.cpp says what shrinks): d_model 128, 4 blocks,
// sequences of 64 in global batches of 2 (4 at 4 ranks), 6 steps.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/parallelize.h"
#include "parallel/world.h"
#include "parallel/zero1.h"
#include "parallel/zero3.h"
#include "tests/parallel/nccl_layouts_runs.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"
#include "train/trainer.h"

namespace mod {

using namespace nccl_runs;

TEST_CASE("every parallel layout trains on the GPU over NCCL as on the CPU, eager and graphed",
          "[mpi][cuda]") {
  const int n = parallel::world().size();
  // Plain tp and ZeRO-1 run at np4 (dp2 x tp2); np2 runs them with sequence parallelism and
  // ZeRO-2 on top.
  const std::vector<Layout> layouts = {{"tiny_mod", "dp=1 tp=2 sequence_parallel=true", 2},
                                       {"tiny_dense", "dp=2 tp=1", 2},
                                       {"tiny_mod", "dp=2 tp=1 zero_stage=2", 2},
                                       {"tiny_mode_staged", "dp=2 ep=2", 2},
                                       {"tiny_mode_staged", "dp=4 ep=2", 4},
                                       {"tiny_mod", "dp=2 tp=2 zero1=true", 4},
                                       // Pipeline stages: their activations and gradients as
                                       // grouped ncclSend/ncclRecv (send_recv).
                                       {"tiny_mod", "dp=1 pp=2", 2, {"train.grad_accum=2"}},
                                       // ... and each stage's units sharded over its dp group.
                                       {"tiny_mod", "dp=2 pp=2 zero_stage=3", 4,
                                        {"train.grad_accum=2"}}};
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != n) continue;
    ++ran;
    INFO(l.recipe << ", layout " << l.layout);
    const Run cpu = train_run(l.recipe, l.layout, "CPU", false, l.sets);
    const Run eager = train_run(l.recipe, l.layout, "CUDA", false, l.sets);
    require_close(eager, cpu, 1e-3);
    const Run graphed = train_run(l.recipe, l.layout, "CUDA", true, l.sets);
    require_close(graphed, eager, 1e-5);
  }
  if (ran == 0) WARN("no layout for " << n << " ranks: np2 and np4 run them");
}

// ZeRO-3 on the GPU path: units gathered on NCCL's comm stream (prefetch one ahead) and
// released by Storage::resize, the sharded AdamW on device tensors. Graphed, every gather and
// gathered parameter lives in the graph's pool; resumed, a new capture gathers into a new pool.
TEST_CASE("ZeRO-3 on the GPU over NCCL: eager as the CPU and graphed and resumed as eager",
          "[mpi][cuda]") {
  const int n = parallel::world().size();
  const std::vector<Layout> layouts = {{"tiny_mod", "dp=2 tp=1 zero_stage=3", 2}};
  int ran = 0;
  for (const Layout& l : layouts) {
    if (l.ranks != n) continue;
    ++ran;
    INFO(l.recipe << ", layout " << l.layout);
    const Run cpu = train_run(l.recipe, l.layout, "CPU", false);
    const Run eager = train_run(l.recipe, l.layout, "CUDA", false);
    require_close(eager, cpu, 1e-3);
    const Run graphed = train_run(l.recipe, l.layout, "CUDA", true);
    require_close(graphed, eager, 1e-5);
    const std::string half = ckpt::checkpoints_dir(eager.dir) + "/" + ckpt::step_dir_name(kSteps / 2);
    const Run resumed = train_run(l.recipe, l.layout, "CUDA", true, {}, parallel::world(), half);
    require_close(resumed, eager, 1e-5, static_cast<size_t>(kSteps / 2));
  }
  if (ran == 0) WARN("no ZeRO-3 layout for " << n << " ranks");
}

// Under BF16 forward reads the optimizer's bf16 weight copies, whose storage ZeRO-3 releases
// and regathers with the unit: the copy part (every matrix and norm; not the embedding, the
// routers or the predictor's logit layer) all-gathered in bf16 straight into the copies, its
// masters never whole. Bit for bit ZeRO-2, where the copies stay whole and are cast from the
// whole masters; the eager run's gathers moved exactly the bytes the shapes give (the copy
// part at 2 bytes an element); graphed, with an evaluation between replays, as eager.
TEST_CASE("ZeRO-3 on the GPU under BF16: weight copies gathered with their unit",
          "[mpi][cuda]") {
  if (parallel::world().size() != 2) {
    WARN("needs 2 ranks");
    return;
  }
  auto run = [](int stage, bool graphed) {
    std::vector<std::string> sets = kSmall;
    sets.insert(sets.end(), {"train.device=CUDA", "train.precision=BF16",
                             std::string("train.cuda_graph=") + (graphed ? "true" : "false")});
    // The graphed run validates after step 4, gathering every unit eagerly between two replays
    // (which must leave the training curve as it is). One batch: rank 1 evaluates nothing and
    // waits in the host's sum while its gathers, queued, must still reach rank 0.
    if (graphed) sets.insert(sets.end(), {"train.eval_every=4", "train.eval_batches=1"});
    const auto cfg = test::tiny_recipe(
        "tiny_mod", kSteps, "dp=2 tp=1 zero_stage=" + std::to_string(stage), sets);
    train::Trainer trainer(cfg, test::shared_dir("nccl_layouts_bf16"), /*quiet=*/true,
                           parallel::world());
    trainer.run();
    if (stage == 3 && !graphed) {
      // Per step the outer unit gathered once, each block twice (forward, backward): both
      // ranks' padded chunks of each parameter, at 2 bytes an element in the copy part.
      const auto named = trainer.model().named_parameters();
      const std::vector<Tensor> part =
          parallel::zero3_copy_part(named, parallel::OptimizerFusion{true, DType::BF16});
      int64_t copies = 0, f32 = 0;
      for (const auto& [name, t] : named) {
        const int64_t times = parallel::zero3_unit(name) == 0 ? 1 : 2;
        const bool in_part = std::any_of(part.begin(), part.end(),
                                         [&t = t](const Tensor& p) { return p.same(t); });
        (in_part ? copies : f32) += times * 2 * parallel::zero1_chunk(t.numel(), 2) * (in_part ? 2 : 4);
      }
      const auto& got = trainer.sharded_units()->gathered_bytes();
      if (parallel::world().rank() == 0)
        std::printf("ZeRO-3 under BF16 at dp2: a step gathers %lld bytes into the weight copies and "
                    "%lld in f32 (all in f32: %lld)\n", static_cast<long long>(got.copies / kSteps),
                    static_cast<long long>(got.f32 / kSteps),
                    static_cast<long long>(2 * copies + f32));
      INFO("per step: " << got.copies / kSteps << " bytes gathered into the copies, " << got.f32 / kSteps
                        << " in f32; from the shapes " << copies << " and " << f32);
      CHECK(got.copies == kSteps * copies);
      CHECK(got.f32 == kSteps * f32);
      CHECK(copies > 4 * f32);  // nearly everything moves at 2 bytes
    }
    return std::pair{Run{trainer.losses(), ""}, trainer.full_parameters()};
  };
  const auto [stage2, stage2_params] = run(2, false);
  const auto [stage3, stage3_params] = run(3, false);
  require_close(stage3, stage2, 0.0);
  const auto [graphed, graphed_params] = run(3, true);
  require_close(graphed, stage3, 1e-5);
  // The owned slices the graph updates are the ones the host gathers from after the replays.
  REQUIRE(graphed_params.size() == stage3_params.size());
  for (size_t i = 0; i < stage3_params.size(); ++i) {
    INFO(stage3_params[i].first);
    CHECK(test::relative_norm_diff(graphed_params[i].second.to(Device::CPU),
                                   stage3_params[i].second.to(Device::CPU)) <= 1e-5);
  }
}

// scripts/gpu_run.sh multirank's check: a dp2 GPU run's checkpoint, resumed by one process on
// one GPU, continues the dp2 run's curve (the same global batch).
TEST_CASE("a dp2 checkpoint written on GPUs resumes on one GPU", "[mpi][cuda]") {
  if (parallel::world().size() != 2) {
    WARN("needs 2 ranks");
    return;
  }
  const Run dp2 = train_run("tiny_mod", "dp=2 tp=1", "CUDA", true);
  const std::string half = ckpt::checkpoints_dir(dp2.dir) + "/" + ckpt::step_dir_name(kSteps / 2);
  parallel::world().barrier();
  if (parallel::world().rank() == 0) {
    auto alone = parallel::make_local_communicator();
    // train.batch_size is global: the one rank takes both ranks' sequences.
    std::vector<std::string> sets = kSmall;
    sets.push_back("train.device=CUDA");
    const auto cfg = test::tiny_recipe("tiny_mod", kSteps, "dp=1 tp=1", sets);
    train::Trainer trainer(cfg, test::temp_dir("nccl_layouts_resumed"), /*quiet=*/true, *alone);
    trainer.resume(half);
    CHECK(trainer.start_step() == kSteps / 2);
    trainer.run();
    require_close(Run{trainer.losses(), ""}, dp2, 1e-3, static_cast<size_t>(kSteps / 2));
  }
  parallel::world().barrier();
}

}  // namespace mod
