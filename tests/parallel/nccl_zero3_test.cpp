// ZeRO-3 on the GPU path beyond plain dp 2 (docs/parallel.md "ZeRO-3 on GPUs"): dp 4, dp 2 x tp 2
// with sequence parallelism (shards of tp shards, gathered over dp only) and staged MoDE with
// ep 2 (with tp 2 too), whose experts shard over their own group edp. Part of nccl_layouts_tests_emulated: our
// kernels on the SIMT emulator, the collectives over NCCL's stand-in. Each layout's eager run
// against the same layout without ZeRO on the CPU (f32: every step's loss within 1e-3 relative;
// not stage 3 there, since the units' sharding is the same code on both devices), the graphed
// run against the eager one (1e-5: the same kernels, the gathers captured in the graph).
// Every run validates after step 2, between two replays when graphed, with fewer validation
// batches than dp ranks: a rank with no batch gathers every unit (gather_all) and goes straight
// to the host's all-reduce of the sums, leaving its gathers queued on the comm stream; its peers'
// gathers need them (emulator/README.md "The runtime": queued collectives progress). Its losses
// against the CPU's to 1e-3.
// Tiny shapes (2 blocks of width 64, sequences of 32, 3 steps) so 4 ranks on 2 cores finish in
// seconds.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "parallel/world.h"
#include "tests/support/metrics_csv.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/trainer.h"

namespace mod {
namespace {

constexpr int kSteps = 3;

struct Zero3Layout {
  const char* recipe;
  const char* layout;  // without zero_stage
  int ranks;
  int eval_batches;  // fewer than the dp ranks: some rank evaluates nothing
};

struct Zero3Run {
  std::vector<double> losses;
  std::vector<double> val_losses;  // metrics.csv's val_loss column (world rank 0 only)
};

// stage3 false: the layout without ZeRO, the reference (sharding code is shared by both devices).
Zero3Run train_zero3(const Zero3Layout& l, const std::string& device, bool graphed,
                     bool stage3 = true) {
  std::vector<std::string> sets = {"model.d_model=64",  "model.n_heads=2",   "model.d_ff=256",
                                   "model.n_layers=2",  "model.seq_len=32",  "train.batch_size=4",
                                   "train.eval_every=2",
                                   "train.eval_batches=" + std::to_string(l.eval_batches),
                                   "train.device=" + device};
  if (device == "CUDA")
    sets.push_back(std::string("train.cuda_graph=") + (graphed ? "true" : "false"));
  const std::string layout = std::string(l.layout) + (stage3 ? " zero_stage=3" : "");
  const auto cfg = test::tiny_recipe(l.recipe, kSteps, layout, sets);
  const std::string dir = test::shared_dir("nccl_zero3");
  train::Trainer trainer(cfg, dir, /*quiet=*/true, parallel::world());
  trainer.run();
  Zero3Run r{trainer.losses(), {}};
  if (parallel::world().rank() == 0)  // its evaluation rows only
    for (double v : test::metrics_values(dir + "/metrics.csv", "val_loss"))
      if (!std::isnan(v)) r.val_losses.push_back(v);
  return r;
}

void require_close(const std::vector<double>& got, const std::vector<double>& want, double rtol) {
  REQUIRE(got.size() == want.size());
  for (size_t s = 0; s < got.size(); ++s) {
    INFO("value " << s + 1 << ": " << got[s] << " vs " << want[s]);
    CHECK(std::isfinite(got[s]));
    CHECK(std::abs(got[s] - want[s]) <= rtol * std::abs(want[s]));
  }
}

}  // namespace

TEST_CASE("ZeRO-3 on the GPU at dp 4, with tp and with ep: eager as the CPU, graphed as eager",
          "[mpi][cuda]") {
  const int n = parallel::world().size();
  const std::vector<Zero3Layout> layouts = {
      // edp is a group of one here (each ep rank alone with its experts): sharded over dp they
      // would gather the other rank's experts.
      {"tiny_mode_staged", "dp=2 ep=2", 2, 1},
      {"tiny_mod", "dp=4", 4, 3},
      {"tiny_mod", "dp=2 tp=2 sequence_parallel=true", 4, 1},
      // edp of two: the ranks holding the same experts.
      {"tiny_mode_staged", "dp=4 ep=2", 4, 3},
      // Both: each tp rank's dense shards sharded over its dp pair, the experts (whole on both
      // tp ranks of an ep rank) over edp, the tp pair.
      {"tiny_mode_staged", "dp=2 tp=2 ep=2", 4, 1},
  };
  int ran = 0;
  for (const Zero3Layout& l : layouts) {
    if (l.ranks != n) continue;
    ++ran;
    INFO(l.recipe << ", layout " << l.layout << " zero_stage=3, world rank "
                  << parallel::world().rank());
    const Zero3Run cpu = train_zero3(l, "CPU", false, /*stage3=*/false);
    const Zero3Run eager = train_zero3(l, "CUDA", false);
    require_close(eager.losses, cpu.losses, 1e-3);
    const Zero3Run graphed = train_zero3(l, "CUDA", true);
    require_close(graphed.losses, eager.losses, 1e-5);
    if (parallel::world().rank() == 0) {
      INFO("val_loss");
      REQUIRE(cpu.val_losses.size() == 2);  // after steps 2 and 3
      require_close(eager.val_losses, cpu.val_losses, 1e-3);
      require_close(graphed.val_losses, eager.val_losses, 1e-5);
    }
  }
  if (ran == 0) WARN("no ZeRO-3 layout here for " << n << " ranks: np2 and np4 run them");
}

}  // namespace mod
