// Interleaved 1F1B in the trainer (docs/parallel.md "Pipeline parallelism"): pp = the world size
// (np2: pp 2, np4: pp 4) with 2 model chunks per rank, against one process and against the
// same run under 1F1B with one chunk per rank. tiny_dense and tiny_mod (its causal predictor
// clipped apart), shrunk to 8 blocks of width 64 so that pp 4 x v 2 = 8 virtual stages of one
// block each fit, for 4 steps of m = 2 pp micro-batches (interleaving needs m a multiple of
// pp; 2 pp reaches its steady one-forward-one-backward phase). Checked: every step's loss and
// the parameters at the end to relative 1e-6 (the gradient norm's squares add over another
// split of the blocks, so a clip factor may differ in its last bit); every routed block's top-C
// choices per micro-batch, bitwise, on the rank whose chunk holds it; the interleaved run's
// step-2 checkpoint continued by one process as the interleaved run continued (the same
// bound); its metrics.csv has a pp_bubble inside (0, 1) on every row, one process's has no
// such column. np4 also trains pp 2 x dp 2 interleaved against one process (the same bound),
// tiny_mod there with ZeRO-1 and ZeRO-2 bit for bit as without, and pp 2 x tp 2 interleaved
// against one process (to 1e-5: tp's partial sums); np2 trains tiny_mod with every block
// recomputed (FULL) bit for bit as without, each rank's peak below the run without. Staged
// MoDE (experts) interleaved at pp 2 (np2) and pp 2 x dp 2 x ep 2 (np4) against one process,
// and (np4) under 1F1B at pp 4, its aux losses and gradient norms checked step by step too.
// Every interleaved run's peak, per rank, within 5% of parallel/pipeline_memory.h's.
// The one-process runs train on world rank 0 alone (np4 would otherwise train four on two
// cores) and are broadcast.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/backend.h"
#include "model/routing_schedule.h"
#include "parallel/pipeline_memory.h"
#include "parallel/pipeline_partition.h"
#include "tests/support/bitwise.h"
#include "tests/support/metrics_csv.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"

using namespace mod;

namespace {
constexpr int kSteps = 4;
constexpr double kBound = 1e-6;
// Under tp the row-parallel layers' partial sums add in another order too: the parity tests'
// bound (measured at pp 2 x tp 2: 1.1e-6 interleaved and under 1F1B alike; dp 2 x tp 2, 1.2e-6).
constexpr double kTpBound = 1e-5;

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  std::vector<std::vector<Tensor>> routing;  // per micro-batch: per routed block run here, [B,C]
  double peak_bytes = 0;  // this rank's peak over the steps, above what it held before
  std::vector<double> aux_losses;  // per step, summed over the stages (every rank)
};

int world_size() { return parallel::world().size(); }

// This rank's peak within 5% of the pipeline planner's for its pp rank (world rank = (pp rank
// x dp + dp rank) x tp + tp rank): its chunks' activations in flight, its own parameters and
// their moments (ZeRO: shards of them).
void check_peak(const std::string& what, const modtrain::RunConfig& cfg, double measured) {
  const int rank = parallel::world().rank();
  const int pp_rank = rank / (cfg.parallel().dp() * cfg.parallel().tp());
  const double predicted = parallel::plan_pipeline_memory(cfg).at(pp_rank).peak;
  std::printf("rank %d, %s: peak predicted %.2f MiB, measured %.2f MiB (%+.1f%%)\n", rank,
              what.c_str(), predicted / 1048576.0, measured / 1048576.0,
              100 * (predicted - measured) / measured);
  INFO(what << ": peak predicted " << predicted << ", measured " << measured);
  // 5%, not the other layouts' 10%: every rank is within 3.4% here, and the terms that only
  // pipelines have (receives posted ahead, the fused head's chunk on the last stage, a send
  // holding its graph) are each 4-8% of these small peaks (docs/parallel.md).
  CHECK(predicted == Approx(measured).epsilon(0.05));
}

modtrain::RunConfig recipe(const std::string& name, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"model.n_layers=8", "model.d_model=64", "model.d_ff=256",
                               "model.seq_len=64", "checkpoint.every_steps=2",
                               "train.grad_accum=" + std::to_string(2 * world_size())});
  return test::tiny_recipe(name, kSteps, "", extra);
}

const std::vector<std::string> kInterleaved = {"parallel.pp_schedule=INTERLEAVED_1F1B",
                                               "parallel.virtual_stages=2"};

Run train_run(const modtrain::RunConfig& cfg, parallel::Communicator& comm, const std::string& dir,
              const std::string& from = "") {
  Run out;
  train::TestHooks hooks;
  hooks.routing_log = &out.routing;
  const double before = static_cast<double>(backend(Device::CPU).memory_stats().in_use_bytes);
  train::Trainer trainer(cfg, dir, /*quiet=*/true, comm, hooks);
  if (!from.empty()) trainer.resume(from);
  trainer.run();
  out.peak_bytes = static_cast<double>(trainer.peak_memory_bytes()) - before;
  out.losses = trainer.losses();
  out.aux_losses = trainer.aux_losses();
  out.params = trainer.full_parameters();
  return out;
}

// World rank 0's run on every rank: losses, parameters (shapes as in `like`) and routing.
Run broadcast_run(const Run& mine, const Run& like) {
  auto& world = parallel::world();
  std::vector<double> v;
  if (world.rank() == 0) {
    v.push_back(static_cast<double>(mine.losses.size()));
    v.insert(v.end(), mine.losses.begin(), mine.losses.end());
    for (const auto& [name, p] : mine.params)
      for (double x : p.to_vector()) v.push_back(x);
    v.push_back(static_cast<double>(mine.routing.size()));
    for (const auto& blocks : mine.routing) {
      v.push_back(static_cast<double>(blocks.size()));
      for (const Tensor& idx : blocks) {
        v.insert(v.end(), {static_cast<double>(idx.size(0)), static_cast<double>(idx.size(1))});
        for (double x : idx.to_vector()) v.push_back(x);
      }
    }
  }
  Tensor size = Tensor::from_vector({static_cast<double>(v.size())}, {1}, DType::F64);
  world.broadcast(size, 0);
  Tensor all = world.rank() == 0 ? Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64)
                                 : Tensor::empty({static_cast<int64_t>(size.at(0))}, DType::F64);
  world.broadcast(all, 0);
  Run out;
  const double* d = all.data<double>();
  out.losses.assign(d + 1, d + 1 + static_cast<int64_t>(d[0]));
  d += 1 + static_cast<int64_t>(d[0]);
  for (const auto& [name, p] : like.params) {
    Tensor t = Tensor::from_vector(std::vector<double>(d, d + p.numel()), p.shape(), DType::F64);
    out.params.emplace_back(name, t.to(p.dtype()));
    d += p.numel();
  }
  out.routing.resize(static_cast<size_t>(*d++));
  for (auto& blocks : out.routing) {
    blocks.resize(static_cast<size_t>(*d++));
    for (Tensor& idx : blocks) {
      const int64_t r = static_cast<int64_t>(d[0]), c = static_cast<int64_t>(d[1]);
      d += 2;
      idx = Tensor::from_vector(std::vector<double>(d, d + r * c), {r, c}, DType::I64);
      d += r * c;
    }
  }
  REQUIRE(d == all.data<double>() + all.numel());
  return out;
}

void check_close(const Run& got, const Run& want, size_t first_step, const std::string& what,
                 double bound = kBound) {
  INFO(what);
  REQUIRE(got.losses.size() + first_step == want.losses.size());
  for (size_t s = 0; s < got.losses.size(); ++s) {
    const double a = got.losses[s], b = want.losses[first_step + s];
    INFO("step " << first_step + s + 1 << ": " << a << " against " << b);
    CHECK(std::abs(a - b) <= bound * std::abs(b));
  }
  REQUIRE(got.params.size() == want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i) {
    INFO("parameter " << want.params[i].first);
    CHECK(test::relative_norm_diff(got.params[i].second, want.params[i].second) < bound);
  }
}

// Rank r's log lists, per micro-batch, the routed blocks of its chunks in block order: each
// bitwise one process's choice for that block.
void check_routing(const modtrain::RunConfig& cfg, const Run& got, const Run& one) {
  const parallel::PipelinePartition part = parallel::plan_partition(cfg);
  const std::vector<bool> routed = model::routed_blocks(cfg.model());
  std::vector<size_t> here;  // indices into one process's list of routed blocks
  for (size_t b = 0, k = 0; b < routed.size(); ++b)
    if (routed[b]) {
      if (part.rank_of(part.stage_of_block(static_cast<int>(b))) == parallel::world().rank())
        here.push_back(k);
      ++k;
    }
  REQUIRE(got.routing.size() == one.routing.size());
  for (size_t i = 0; i < one.routing.size(); ++i) {
    INFO("micro-batch " << i);
    REQUIRE(got.routing[i].size() == here.size());
    for (size_t k = 0; k < here.size(); ++k)
      test::check_bitwise(got.routing[i][k].to_vector(), one.routing[i][here[k]].to_vector());
  }
}
}  // namespace

TEST_CASE("interleaved 1F1B equals one process and 1F1B, and resumes on one process",
          "[mpi][pipeline]") {
  if (world_size() < 2) return;  // pp needs two ranks
  auto& world = parallel::world();
  const int rank = world.rank(), pp = world_size();
  const std::string pp_field = "parallel.pp=" + std::to_string(pp);
  test::self_group();  // made by a split over the world: every rank, before rank 0 alone uses it
  for (const char* name : {"tiny_dense", "tiny_mod"}) {
    INFO(name << " at pp " << pp);
    const modtrain::RunConfig cfg = recipe(name, {pp_field, kInterleaved[0], kInterleaved[1]});
    const std::string dir = test::shared_dir("ppv_run");
    const Run interleaved = train_run(cfg, world, dir);
    const Run one_f_one_b = train_run(recipe(name, {pp_field}), world, test::shared_dir("ppv_1f1b"));
    check_peak(std::string(name) + " interleaved", cfg, interleaved.peak_bytes);
    check_close(interleaved, one_f_one_b, 0, "interleaved against 1F1B");

    Run mine;
    const std::string one_dir = rank == 0 ? test::temp_dir("ppv_one") : "";
    if (rank == 0) mine = train_run(recipe(name, {}), test::self_group(), one_dir);
    const Run one = broadcast_run(mine, interleaved);
    check_close(interleaved, one, 0, "interleaved against one process");

    // pp 2, tiny_mod: every block recomputed, in both chunks (a chunk's first block from its
    // received activation), bit for bit the interleaved run keeping its activations, with a
    // lower peak on every rank.
    if (pp == 2 && std::string(name) == "tiny_mod") {
      INFO("interleaved with train.recompute=FULL against without");
      const Run full = train_run(recipe(name, {pp_field, kInterleaved[0], kInterleaved[1],
                                               "train.recompute=FULL"}),
                                 world, test::shared_dir("ppv_full"));
      test::check_runs_bitwise(full.losses, full.params, interleaved.losses, interleaved.params);
      check_peak("tiny_mod interleaved, FULL",
                 recipe(name, {pp_field, kInterleaved[0], kInterleaved[1], "train.recompute=FULL"}),
                 full.peak_bytes);
      INFO("peak " << full.peak_bytes << " bytes against " << interleaved.peak_bytes);
      CHECK(full.peak_bytes < interleaved.peak_bytes);
      std::printf("rank %d, interleaved pp 2: peak %.1f MiB with FULL recomputation, %.1f without\n",
                  rank, full.peak_bytes / 1048576.0, interleaved.peak_bytes / 1048576.0);
    }

    // np4 also pp 2 x dp 2, interleaved: each rank's buckets hold both its chunks' blocks; for
    // tiny_mod with ZeRO-1 and ZeRO-2 over each stage's dp pair, bit for bit as without (a sum
    // of two is the same reduced or reduce-scattered); and pp 2 x tp 2 interleaved.
    if (pp == 4) {
      const std::vector<std::string> ppdp_fields = {"parallel.pp=2", "parallel.dp=2",
                                                    kInterleaved[0], kInterleaved[1]};
      const Run ppdp = train_run(recipe(name, ppdp_fields), world, test::shared_dir("ppv_ppdp"));
      check_close(ppdp, one, 0, "pp 2 x dp 2 interleaved against one process");
      if (std::string(name) == "tiny_mod")
        for (const char* stage : {"parallel.zero_stage=1", "parallel.zero_stage=2"}) {
          std::vector<std::string> fields = ppdp_fields;
          fields.push_back(stage);
          const Run zero = train_run(recipe(name, fields), world, test::shared_dir("ppv_zero"));
          check_peak(std::string("tiny_mod pp 2 x dp 2 interleaved, ") + stage, recipe(name, fields),
                     zero.peak_bytes);
          INFO("pp 2 x dp 2 interleaved, " << stage << ", against without ZeRO");
          test::check_runs_bitwise(zero.losses, zero.params, ppdp.losses, ppdp.params);
        }
      const Run pptp = train_run(recipe(name, {"parallel.pp=2", "parallel.tp=2", kInterleaved[0],
                                               kInterleaved[1]}),
                                 world, test::shared_dir("ppv_pptp"));
      check_close(pptp, one, 0, "pp 2 x tp 2 interleaved against one process", kTpBound);
      check_peak(std::string(name) + " pp 2 x tp 2 interleaved",
                 recipe(name, {"parallel.pp=2", "parallel.tp=2", kInterleaved[0], kInterleaved[1]}),
                 pptp.peak_bytes);
      check_peak(std::string(name) + " pp 2 x dp 2 interleaved", recipe(name, ppdp_fields),
                 ppdp.peak_bytes);
    }

    REQUIRE(parallel::plan_partition(cfg).virtual_stages == 2);
    check_routing(cfg, interleaved, one);

    // Rank 0: one process continues the interleaved run's step-2 checkpoint; the pipelined run's
    // metrics.csv has the bubble, one process's has none.
    if (rank == 0) {
      const Run resumed = train_run(recipe(name, {}), test::self_group(), test::temp_dir("ppv_resumed"),
                                    ckpt::checkpoints_dir(dir) + "/" + ckpt::step_dir_name(2));
      check_close(resumed, interleaved, 2, "one process resuming the interleaved checkpoint");
      const std::vector<std::string> bubble = test::metrics_cells(dir + "/metrics.csv", "pp_bubble");
      REQUIRE(bubble.size() == static_cast<size_t>(kSteps));
      for (const std::string& b : bubble) {
        INFO("pp_bubble '" << b << "'");
        REQUIRE(!b.empty());
        CHECK((std::stod(b) > 0 && std::stod(b) < 1));
      }
      CHECK_FALSE(test::metrics_has_column(one_dir + "/metrics.csv", "pp_bubble"));
    }
    world.barrier();
  }
}

// Experts under interleaving: staged MoDE (an MoE layer in every block, the routed ones every
// other) at pp 2 interleaved (np2), and at pp 2 x dp 2 x ep 2 interleaved (np4: each stage's dp
// pair an ep pair, half of its blocks' experts on each rank), against one process (the bound
// above): losses, with the MoE balance and z losses summed over the stages, and parameters.
TEST_CASE("interleaved 1F1B with experts equals one process", "[mpi][pipeline][moe]") {
  if (world_size() != 2 && world_size() != 4) return;
  auto& world = parallel::world();
  test::self_group();
  Run mine;
  if (world.rank() == 0)
    mine = train_run(recipe("tiny_mode_staged", {}), test::self_group(), test::temp_dir("ppv_moe_one"));
  std::vector<std::string> fields = {"parallel.pp=2", kInterleaved[0], kInterleaved[1]};
  if (world_size() == 4) fields.insert(fields.end(), {"parallel.dp=2", "parallel.ep=2"});
  const Run got = train_run(recipe("tiny_mode_staged", fields), world, test::shared_dir("ppv_moe"));
  check_peak("tiny_mode_staged interleaved", recipe("tiny_mode_staged", fields), got.peak_bytes);
  check_close(got, broadcast_run(mine, got), 0,
              world_size() == 4 ? "pp 2 x dp 2 x ep 2 interleaved against one process"
                                : "pp 2 interleaved against one process");
}

// Staged MoDE at pp 4 under 1F1B (np4), shrunk to 4 blocks of width 64 (one a stage, each with
// its expert-choice MoE layer; the routed blocks 1 and 3 on stages 1 and 3), 4 micro-batches of
// one sequence of 64, 2 steps, against one process step by step: the LM losses (the first
// step's bitwise) and the parameters to the bound above; the aux losses (the MoE z losses and
// the predictors' BCE, each stage's summed over pp: f64 sums of f32 terms in another order) and
// the gradient norms (metrics.csv; the stages' squares summed over pp) to relative 1e-6; every
// routed block's top-C choices per micro-batch, bitwise. Measured: both LM losses bitwise, the
// aux losses 1.2e-8, the gradient norms 1.9e-9, the parameters 1.0e-8.
TEST_CASE("1F1B with experts at pp 4 equals one process with aux losses summed over the stages",
          "[mpi][pipeline][moe]") {
  if (world_size() != 4) return;
  auto& world = parallel::world();
  const int rank = world.rank();
  auto cfg = [](std::vector<std::string> fields) {
    fields.insert(fields.begin(), {"model.n_layers=4", "model.d_model=64", "model.d_ff=256",
                                   "model.seq_len=64", "train.grad_accum=4",
                                   "checkpoint.every_steps=0"});
    return test::tiny_recipe("tiny_mode_staged", 2, "", fields);
  };
  test::self_group();
  Run mine;
  const std::string one_dir = rank == 0 ? test::temp_dir("ppv_moe4_one") : "";
  if (rank == 0) mine = train_run(cfg({}), test::self_group(), one_dir);
  const modtrain::RunConfig pp_cfg = cfg({"parallel.pp=4", "parallel.pp_schedule=ONE_F_ONE_B"});
  const std::string dir = test::shared_dir("ppv_moe4");
  const Run got = train_run(pp_cfg, world, dir);
  const Run one = broadcast_run(mine, got);
  check_close(got, one, 0, "staged MoDE, pp 4 1F1B against one process");
  // The first step's LM loss comes from the same parameters through the same ops: bitwise.
  CHECK(got.losses.at(0) == one.losses.at(0));
  check_routing(pp_cfg, got, one);
  if (rank != 0) return;  // one process's aux losses and metrics.csv are rank 0's
  const std::vector<std::string> norms = test::metrics_cells(dir + "/metrics.csv", "grad_norm"),
                                 one_norms = test::metrics_cells(one_dir + "/metrics.csv", "grad_norm");
  REQUIRE(got.aux_losses.size() == mine.aux_losses.size());
  REQUIRE(norms.size() == one_norms.size());
  REQUIRE(norms.size() == got.losses.size());
  for (size_t s = 0; s < norms.size(); ++s) {
    const double a = got.aux_losses[s], b = mine.aux_losses[s];
    const double g = std::stod(norms[s]), w = std::stod(one_norms[s]);
    INFO("step " << s + 1 << ": aux loss " << a << " against " << b << ", gradient norm " << g
                 << " against " << w);
    CHECK(b != 0);
    CHECK(std::abs(a - b) <= 1e-6 * std::abs(b));
    CHECK(std::abs(g - w) <= 1e-6 * std::abs(w));
  }
}
