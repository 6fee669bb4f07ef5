// ParallelDims's equation and its errors (any world size), and the trainer under pipeline stages
// composed with data parallelism, pp 2 x dp 2 (np4), against
// one process with the same micro-batches (what `mpirun -np 4 modtrain train --set
// parallel.pp=2 --set parallel.dp=2` runs): the mesh's ranks in the documented order (tp
// fastest, then dp, then pp); tiny_dense and tiny_mod (its causal predictor clipped apart) for
// 4 steps of 2 micro-batches under 1F1B, each dp rank of a stage on its half of the rows. Checked
// every step: the loss (the last stage's, averaged over dp) and, at the end, the parameters to
// relative kBound: each dp rank's loss is a mean over its rows and the dp mean of those, and the
// gradients are averaged over dp in buckets, another association than one process's single sum
// (measured in docs/parallel.md); every routed block's top-C choices on the stage's rows, per
// micro-batch, bitwise. The pp 2 x dp 2 run's step-2 checkpoint records pp and dp and resumes
// on one process (world rank 0) and, tiny_mod's, at pp 4 (every stage's blocks resharded), each
// continuing as the pp 2 x dp 2 run did (the same bound).
// tiny_mod also trains under pp 4 (two middle stages that read no data) and pp 2 x tp 2 against
// one process (the same bound), and under pp 2 x dp 2 with ZeRO-1, 2 and 3 (each stage's dp
// pair sharding what the stage owns) bitwise as without ZeRO, ZeRO-3 under GPipe and 1F1B and
// bitwise to ZeRO-2; under interleaved 1F1B (2 chunks a rank) ZeRO-3 bitwise to ZeRO-2 and
// both against one process (the same bound); ZeRO-1's step-2 checkpoint resumes on one process;
// so does ZeRO-3's (GPipe; each stage's dp pair sharding the parameters of its own units).
// pp 2 x tp 2 with sequence parallelism equals pp 2 x tp 2 without it (routing bitwise, losses
// and parameters within SP's bounds) and one process, and each rank's peak of both within 10%
// of the pipeline planner's (parallel/pipeline_memory.h). tiny_mode_staged trains
// under pp 2 x dp 2 x ep 2 as one process. At np8, the 3-D layout pp 2 x dp 2 x tp 2 (SP,
// ZeRO-1): the mesh's ranks and groups, and tiny_mod against one process step by step (losses,
// gradient norms, routing), the stages' links at 1/tp of the stream, and its checkpoint resumed
// on one process, at pp 2 x tp 2 and at pp 2 x dp 2.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>

#include "core/backend.h"
#include "model/memory_plan.h"
#include "model/transformer.h"
#include "parallel/communicator.h"
#include "parallel/counting_communicator.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_memory.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/world.h"
#include "tests/support/bitwise.h"
#include "tests/support/metrics_csv.h"
#include "tests/support/shared_dir.h"
#include "tests/support/tiny_runs.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/reader.h"

using namespace mod;

namespace {
constexpr int kSteps = 4, kMicroBatches = 2;
constexpr double kBound = 1e-6;  // relative: losses and parameters (measured 1.1e-7)
const std::vector<std::string> kLayout = {"parallel.pp=2", "parallel.dp=2"};

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  std::vector<std::vector<Tensor>> routing;  // per micro-batch: per routed block run here, [B,C]
  std::vector<std::string> released;  // parameters left without bytes (other stages', ZeRO-3's)
  std::string dir;  // its run directory (metrics.csv: world rank 0's)
  double peak_bytes = 0;  // this rank's peak over the steps, above what it held before
};

modtrain::RunConfig recipe(const std::string& name, const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"train.grad_accum=" + std::to_string(kMicroBatches),
                                   "checkpoint.every_steps=2", "parallel.pp_schedule=ONE_F_ONE_B"};
  sets.insert(sets.end(), extra.begin(), extra.end());  // extra may set another schedule
  return test::tiny_recipe(name, kSteps, "", sets);
}

Run train_run(const std::string& name, parallel::Communicator& comm, const std::string& dir,
              const std::vector<std::string>& extra, const std::string& from = "") {
  Run out;
  out.dir = dir;
  train::TestHooks hooks;
  hooks.routing_log = &out.routing;
  const double before = static_cast<double>(backend(Device::CPU).memory_stats().in_use_bytes);
  train::Trainer trainer(recipe(name, extra), dir, /*quiet=*/true, comm, hooks);
  if (!from.empty()) trainer.resume(from);
  trainer.run();
  out.peak_bytes = static_cast<double>(trainer.peak_memory_bytes()) - before;
  for (const auto& [n, p] : trainer.model().named_parameters())
    if (p.impl()->storage->bytes() == 0) out.released.push_back(n);
  out.losses = trainer.losses();
  out.params = trainer.full_parameters();
  return out;
}

void check_close(const Run& got, const Run& want, size_t first_step, double bound = kBound) {
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

// One process's run, trained on world rank 0 alone and sent to every rank as one f64 vector:
// losses, parameters (in named_parameters order), then per micro-batch the routed blocks'
// [rows, cols, indices...]. (Four ranks each training it would double the test's time.)
// extra: the shape and step count both runs take.
Run reference(const std::string& name, const std::vector<std::string>& extra = {}) {
  auto& world = parallel::world();
  parallel::Communicator& alone = test::self_group();  // a collective split the first time: on every rank
  Run one;
  std::vector<double> v;
  if (world.rank() == 0) {
    one = train_run(name, alone, test::temp_dir("ppdp_one"), extra);
    v = one.losses;
    for (const auto& [n, t] : one.params) for (double x : t.to_vector()) v.push_back(x);
    for (const auto& blocks : one.routing) {
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
  if (world.rank() == 0) return one;
  const modtrain::RunConfig cfg = recipe(name, extra);
  const int steps = cfg.train().steps();
  const double* d = all.data<double>();
  one.losses.assign(d, d + steps);
  d += steps;
  const model::Transformer shapes(cfg.model(), 0);
  for (const auto& [n, t] : shapes.named_parameters()) {
    one.params.emplace_back(n, Tensor::from_vector(std::vector<double>(d, d + t.numel()), t.shape(), t.dtype()));
    d += t.numel();
  }
  for (int i = 0; i < steps * kMicroBatches; ++i) {
    one.routing.emplace_back(static_cast<size_t>(*d++));
    for (Tensor& idx : one.routing.back()) {
      const int64_t r = static_cast<int64_t>(d[0]), c = static_cast<int64_t>(d[1]);
      d += 2;
      idx = Tensor::from_vector(std::vector<double>(d, d + r * c), {r, c}, DType::I64);
      d += r * c;
    }
  }
  REQUIRE(d == all.data<double>() + all.numel());
  return one;
}

// Sequence parallelism under pp 2 x tp 2: each stage's tp pair holds [b, T/2, D] of the stream
// and sends its part to the same tp rank of the next stage. Against plain tp on the same ranks:
// every routed block's top-C choices, per micro-batch, bitwise (top-C of the gathered scores);
// step 1's loss bitwise; later losses and the parameters within the bounds of the one-process
// SP parity test (parity_tests: 2e-6 and 1e-5, relative), since the sequence-partial gradients
// (norms, routers, predictors) are summed over each rank's half of the positions, then over tp.
// Against one process to 1e-5. Each rank's peak within 10% of the pipeline planner's for its pp
// rank, plain tp's and SP's, and SP's below plain tp's, measured and predicted.
void check_sequence_parallel(const std::string& name, std::vector<std::string> layout,
                             const Run& tp, const Run& one) {
  INFO("pp 2 x tp 2 with sequence parallelism");
  const int rank = parallel::world().rank(), pp_rank = rank / 2;  // tp fastest (mesh.h)
  const double tp_predicted = parallel::plan_pipeline_memory(recipe(name, layout)).at(pp_rank).peak;
  layout.push_back("parallel.sequence_parallel=true");
  const Run sp = train_run(name, parallel::world(), test::shared_dir("pp_sp"), layout);
  const double sp_predicted = parallel::plan_pipeline_memory(recipe(name, layout)).at(pp_rank).peak;
  std::printf("rank %d (pp rank %d), %s pp 2 x tp 2: peak predicted %s, measured %s (%+.1f%%); "
              "with sequence parallelism predicted %s, measured %s (%+.1f%%)\n",
              rank, pp_rank, name.c_str(), model::format_bytes(tp_predicted).c_str(),
              model::format_bytes(tp.peak_bytes).c_str(),
              100 * (tp_predicted - tp.peak_bytes) / tp.peak_bytes,
              model::format_bytes(sp_predicted).c_str(), model::format_bytes(sp.peak_bytes).c_str(),
              100 * (sp_predicted - sp.peak_bytes) / sp.peak_bytes);
  {
    INFO("peaks: plain tp predicted " << tp_predicted << ", measured " << tp.peak_bytes
                                      << "; SP predicted " << sp_predicted << ", measured "
                                      << sp.peak_bytes);
    CHECK(tp_predicted == Approx(tp.peak_bytes).epsilon(0.10));
    CHECK(sp_predicted == Approx(sp.peak_bytes).epsilon(0.10));
    CHECK(sp.peak_bytes < tp.peak_bytes);
    CHECK(sp_predicted < tp_predicted);
  }
  REQUIRE(sp.routing.size() == tp.routing.size());
  for (size_t i = 0; i < tp.routing.size(); ++i) {
    INFO("step " << i / kMicroBatches + 1 << ", micro-batch " << i % kMicroBatches);
    REQUIRE(sp.routing[i].size() == tp.routing[i].size());
    for (size_t k = 0; k < tp.routing[i].size(); ++k)
      test::check_bitwise(sp.routing[i][k].to_vector(), tp.routing[i][k].to_vector());
  }
  REQUIRE(sp.losses.size() == tp.losses.size());
  CHECK(sp.losses[0] == tp.losses[0]);
  double worst_loss = 0, worst_param = 0, worst_one = 0;
  for (size_t s = 0; s < tp.losses.size(); ++s) {
    const double rel = std::abs(sp.losses[s] - tp.losses[s]) / std::abs(tp.losses[s]);
    INFO("step " << s + 1 << ": " << sp.losses[s] << " against plain tp's " << tp.losses[s]);
    CHECK(rel <= 2e-6);
    worst_loss = std::max(worst_loss, rel);
    const double rel_one = std::abs(sp.losses[s] - one.losses[s]) / std::abs(one.losses[s]);
    CHECK(rel_one <= 1e-5);
    worst_one = std::max(worst_one, rel_one);
  }
  for (size_t i = 0; i < tp.params.size(); ++i) {
    INFO("parameter " << tp.params[i].first);
    const double rel = test::relative_norm_diff(sp.params[i].second, tp.params[i].second);
    CHECK(rel < 1e-5);
    worst_param = std::max(worst_param, rel);
    const double rel_one = test::relative_norm_diff(sp.params[i].second, one.params[i].second);
    CHECK(rel_one < 1e-5);
    worst_one = std::max(worst_one, rel_one);
  }
  if (parallel::world().rank() == 0)
    std::printf("pp 2 x tp 2 %s with sequence parallelism: against plain tp, losses %.2e (step 1 "
                "%s), parameters %.2e; against one process %.2e (relative, worst of %d steps)\n",
                name.c_str(), worst_loss, sp.losses[0] == tp.losses[0] ? "bitwise" : "not bitwise",
                worst_param, worst_one, kSteps);
}

// The world ranks of `group`, in group-rank order.
std::vector<int64_t> members(parallel::Communicator& group) {
  Tensor mine = Tensor::from_indices({parallel::world().rank()}, {1});
  Tensor all = Tensor::empty({group.size()}, DType::I64);
  group.all_gather(mine, all);
  std::vector<int64_t> out;
  for (double x : all.to_vector()) out.push_back(static_cast<int64_t>(x));
  return out;
}

// Rows [begin, end) of idx [B,C].
std::vector<double> rows(const Tensor& idx, int64_t begin, int64_t end) {
  const std::vector<double> all = idx.to_vector();
  const int64_t c = idx.size(1);
  return {all.begin() + begin * c, all.begin() + end * c};
}
}  // namespace

// Pure checks, at any world size: the world must be dp x tp x pp, and ep must divide dp.
TEST_CASE("ParallelDims: dp x tp x pp is the world size, errors print the equation",
          "[mpi][pipeline]") {
  using parallel::ParallelDims;
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no error";
  };
  CHECK_NOTHROW(ParallelDims{2, 1, 1, 1}.validate(2));
  CHECK_NOTHROW(ParallelDims{2, 1, 1, 2}.validate(4));
  CHECK_NOTHROW(ParallelDims{2, 2, 1, 2}.validate(8));
  CHECK_THAT(error_of([] { ParallelDims{2, 1, 1, 1}.validate(4); }),
             Catch::Matchers::Contains("dp (2) x tp (1) = 2 does not equal the world size 4"));
  CHECK_THAT(error_of([] { ParallelDims{2, 1, 1, 2}.validate(2); }),
             Catch::Matchers::Contains("dp (2) x tp (1) x pp (2) = 4 does not equal the world size "
                                       "2 (the number of processes); set parallel.dp, parallel.tp "
                                       "and parallel.pp so that dp x tp x pp = 2"));
  CHECK_THAT(error_of([] { ParallelDims{4, 1, 3, 1}.validate(4); }),
             Catch::Matchers::Contains("ep (3) must divide dp (4)"));
  modtrain::ParallelConfig cfg;
  cfg.set_pp(2);
  cfg.set_dp(2);
  CHECK(ParallelDims::from_config(cfg).dp == 2);
  cfg.set_ep(2);  // experts sharded inside each stage
  CHECK(ParallelDims::from_config(cfg).ep == 2);
}

// Expert parallelism inside each stage: pp 2 x dp 2 x ep 2, each stage's dp pair an ep pair
// holding half of every MoE layer's experts of the stage's blocks (the all-to-all within the
// pair), against one process (the bound above).
TEST_CASE("pp 2 x dp 2 x ep 2: MoDE with experts sharded in each stage trains as one process",
          "[mpi][pipeline][moe]") {
  auto& world = parallel::world();
  if (world.size() != 4) return;
  const Run one = reference("tiny_mode_staged");
  std::vector<std::string> layout = kLayout;
  layout.push_back("parallel.ep=2");
  check_close(train_run("tiny_mode_staged", world, test::shared_dir("ppdpep"), layout), one, 0);
}

TEST_CASE("pp x dp mesh: a stage is a run of dp x tp ranks, tp fastest", "[mpi][pipeline]") {
  auto& world = parallel::world();
  const int r = world.rank();
  if (world.size() == 8) {  // pp 2 x dp 2 x tp 2: world rank = (pp x 2 + dp) x 2 + tp
    const int pp = r / 4, dp = r / 2 % 2, tp = r % 2;
    for (const int ep : {1, 2}) {
      parallel::Mesh mesh(world, {/*dp=*/2, /*tp=*/2, /*ep=*/ep, /*pp=*/2});
      INFO("pp 2 x dp 2 x tp 2, ep " << ep << ", world rank " << r);
      CHECK(mesh.pp_rank() == pp);
      CHECK(mesh.dp_rank() == dp);
      CHECK(mesh.tp_rank() == tp);
      CHECK(members(mesh.tp()) == std::vector<int64_t>{r / 2 * 2, r / 2 * 2 + 1});
      CHECK(members(mesh.dp()) == std::vector<int64_t>{pp * 4 + tp, pp * 4 + 2 + tp});
      CHECK(members(mesh.pp()) == std::vector<int64_t>{r % 4, r % 4 + 4});
      // ep: the dp pair (ep 2) or this rank; edp: the ranks of the stage holding the same
      // experts, the stage's four (ep 1) or its tp pair (ep 2).
      CHECK(members(mesh.ep()) == (ep == 1 ? std::vector<int64_t>{r} : members(mesh.dp())));
      CHECK(members(mesh.edp()) == (ep == 1 ? std::vector<int64_t>{pp * 4, pp * 4 + 1, pp * 4 + 2, pp * 4 + 3}
                                            : members(mesh.tp())));
    }
    return;
  }
  if (world.size() != 4) return;  // pp 2 x dp 2, or pp 2 x tp 2
  {
    parallel::Mesh mesh(world, {/*dp=*/2, /*tp=*/1, /*ep=*/1, /*pp=*/2});
    INFO("pp 2 x dp 2, world rank " << r);
    CHECK(mesh.pp_rank() == r / 2);
    CHECK(mesh.dp_rank() == r % 2);
    CHECK(members(mesh.dp()) == std::vector<int64_t>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(members(mesh.pp()) == std::vector<int64_t>{r % 2, r % 2 + 2});
    CHECK(members(mesh.tp()) == std::vector<int64_t>{r});
  }
  {
    parallel::Mesh mesh(world, {/*dp=*/1, /*tp=*/2, /*ep=*/1, /*pp=*/2});
    INFO("pp 2 x tp 2, world rank " << r);
    CHECK(mesh.pp_rank() == r / 2);
    CHECK(mesh.tp_rank() == r % 2);
    CHECK(members(mesh.tp()) == std::vector<int64_t>{r / 2 * 2, r / 2 * 2 + 1});
    CHECK(members(mesh.pp()) == std::vector<int64_t>{r % 2, r % 2 + 2});
    CHECK(members(mesh.dp()) == std::vector<int64_t>{r});
  }
}

TEST_CASE(
    "pp 2 x dp 2 trains as one process, routes the same tokens and resumes at pp 4 and on one "
    "process",
    "[mpi][pipeline]") {
  auto& world = parallel::world();
  if (world.size() != 4) return;  // pp 2 x dp 2
  const int rank = world.rank(), stage = rank / 2, dp_rank = rank % 2;
  for (const std::string name : {"tiny_dense", "tiny_mod"}) {
    INFO(name << ", world rank " << rank);
    const Run one = reference(name);
    const std::string dir = test::shared_dir("ppdp_run");
    const Run ppdp = train_run(name, world, dir, kLayout);
    check_close(ppdp, one, 0);
    double worst_loss = 0, worst_param = 0;  // printed for docs/parallel.md
    for (size_t i = 0; i < one.losses.size(); ++i)
      worst_loss = std::max(worst_loss, std::abs(ppdp.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
    for (size_t i = 0; i < one.params.size(); ++i)
      worst_param = std::max(worst_param, test::relative_norm_diff(ppdp.params[i].second, one.params[i].second));
    if (rank == 0)
      std::printf("pp 2 x dp 2 %s: against one process, losses %.2e (step 1 %s), parameters %.2e "
                  "(relative, worst of %d steps)\n",
                  name.c_str(), worst_loss, ppdp.losses[0] == one.losses[0] ? "bitwise" : "not bitwise",
                  worst_param, kSteps);

    // The stage's routed blocks on this dp rank's rows, against one process's, per micro-batch.
    const modtrain::RunConfig cfg = recipe(name, kLayout);
    const parallel::PipelinePartition part = parallel::plan_partition(cfg);
    const model::Transformer shapes(cfg.model(), 0);
    size_t first_routed = 0, stage_routed = 0;  // this stage's routed blocks in one process's list
    for (size_t b = 0; b < shapes.num_blocks(); ++b) {
      if (!shapes.routed(b)) continue;
      const int owner = part.stage_of_block(static_cast<int>(b));
      if (owner < stage) ++first_routed;
      if (owner == stage) ++stage_routed;
    }
    const int64_t rows_per_rank = cfg.train().batch_size() / 2;
    REQUIRE(ppdp.routing.size() == one.routing.size());
    REQUIRE(one.routing.size() == static_cast<size_t>(kSteps * kMicroBatches));
    for (size_t i = 0; i < one.routing.size(); ++i) {
      INFO("step " << i / kMicroBatches + 1 << ", micro-batch " << i % kMicroBatches);
      REQUIRE(ppdp.routing[i].size() == stage_routed);
      for (size_t k = 0; k < stage_routed; ++k) {
        INFO("routed block " << first_routed + k << " of one process's list");
        REQUIRE(ppdp.routing[i][k].size(0) == rows_per_rank);
        test::check_bitwise(ppdp.routing[i][k].to_vector(),
                            rows(one.routing[i][first_routed + k], dp_rank * rows_per_rank,
                                 (dp_rank + 1) * rows_per_rank));
      }
    }
    if (name == "tiny_mod") CHECK(stage_routed > 0);

    // The step-2 checkpoint records the layout, and one process continues it.
    const std::string step2 = ckpt::checkpoints_dir(dir) + "/" + ckpt::step_dir_name(2);
    {
      ckpt::CheckpointReader reader(step2);
      CHECK(reader.state().mesh.pp == 2);
      CHECK(reader.state().mesh.dp == 2);
      CHECK(reader.state().mesh.tp == 1);
      CHECK(reader.state().mesh.world_size == 4);
    }
    // Each rank holds the bytes of only its stage's parameters (the tied embedding: both ends).
    std::vector<std::string> others, all_names;
    for (const auto& [n, p] : one.params) {
      all_names.push_back(n);
      if (!parallel::stage_owns(part, stage, n, /*tie_embeddings=*/true)) others.push_back(n);
    }
    CHECK(ppdp.released == others);
    if (name == "tiny_mod") {
      // ZeRO-1, 2 and 3: each stage's dp pair shards the moments (and gradients; at stage 3
      // the parameters, in the stage's own units) of what the stage owns; the tied embedding's
      // owned slices sum over its two ends, the norm's squares over the dp pair, then over pp.
      // Against pp 2 x dp 2 without ZeRO, bitwise: a sum of two ranks is the same reduced or
      // scattered, the gathered parameters are exact copies, and each element takes the same
      // AdamW update (the norm's squares add in another order, but its f64 sum rounds to the
      // same clip factor here); so one process's bound. ZeRO-1's and ZeRO-3's step-2
      // checkpoints (moments gathered over the stage's dp pair, stage 3's units gathered, by
      // global name) resume on one process.
      // Stage 3 under each schedule: GPipe (the last stage holds both micro-batches in
      // flight, so the head's unit must stay whole until the last one's backward) and 1F1B
      // (stage 0 holds two in flight: the blocks go after each backward, the embedding's unit
      // stays), each bitwise to 1F1B without ZeRO and to ZeRO-2.
      const std::pair<int, const char*> zero_runs[] = {
          {1, "ONE_F_ONE_B"}, {2, "ONE_F_ONE_B"}, {3, "GPIPE"}, {3, "ONE_F_ONE_B"}};
      Run zero2;
      for (const auto& [zero, schedule] : zero_runs) {
        INFO("ZeRO stage " << zero << " under " << schedule);
        std::vector<std::string> layout = kLayout;
        layout.push_back("parallel.zero_stage=" + std::to_string(zero));
        layout.push_back(std::string("parallel.pp_schedule=") + schedule);
        const std::string zdir = test::shared_dir("ppdp_zero");
        const Run z = train_run(name, world, zdir, layout);
        test::check_bitwise(z.losses, ppdp.losses);
        // Between steps no rank holds another stage's parameters; at stage 3 its own are
        // sharded, so none is whole.
        CHECK(z.released == (zero == 3 ? all_names : others));
        for (size_t i = 0; i < ppdp.params.size(); ++i) {
          INFO("parameter " << ppdp.params[i].first);
          test::check_bitwise(z.params[i].second.to_vector(), ppdp.params[i].second.to_vector());
        }
        check_close(z, one, 0);
        if (zero == 2) zero2 = z;
        if (zero == 3) {
          test::check_bitwise(z.losses, zero2.losses);
          for (size_t i = 0; i < zero2.params.size(); ++i) {
            INFO("parameter " << zero2.params[i].first << " against ZeRO-2");
            test::check_bitwise(z.params[i].second.to_vector(), zero2.params[i].second.to_vector());
          }
        }
        if ((zero == 1 || std::string(schedule) == "GPIPE") && rank == 0) {
          const Run resumed = train_run(name, test::self_group(), test::temp_dir("ppdp_zero_resumed"), {},
                                        ckpt::checkpoints_dir(zdir) + "/" + ckpt::step_dir_name(2));
          check_close(resumed, z, 2);
        }
      }
      // Interleaved 1F1B, 2 chunks a rank (blocks 0-1 and 4 on stage 0, 2-3 and 5 on stage 1):
      // each dp pair shards the units of both its chunks. Stage 3 bitwise to ZeRO-2 under the
      // same schedule, both against one process (the bound above: the stages' squares add in
      // another order than under 1F1B).
      {
        std::vector<std::string> interleaved = kLayout;
        interleaved.insert(interleaved.end(), {"parallel.pp_schedule=INTERLEAVED_1F1B",
                                               "parallel.virtual_stages=2"});
        Run by_stage[2];
        for (const int zero : {2, 3}) {
          INFO("interleaved 1F1B, ZeRO stage " << zero);
          std::vector<std::string> layout = interleaved;
          layout.push_back("parallel.zero_stage=" + std::to_string(zero));
          by_stage[zero - 2] = train_run(name, world, test::shared_dir("ppdp_zero"), layout);
          check_close(by_stage[zero - 2], one, 0);
        }
        INFO("interleaved 1F1B: ZeRO-3 against ZeRO-2");
        test::check_bitwise(by_stage[1].losses, by_stage[0].losses);
        CHECK(by_stage[1].released == all_names);
        for (size_t i = 0; i < by_stage[0].params.size(); ++i) {
          INFO("parameter " << by_stage[0].params[i].first);
          test::check_bitwise(by_stage[1].params[i].second.to_vector(),
                              by_stage[0].params[i].second.to_vector());
        }
      }
      // pp 4: stages 1 and 2 read neither tokens nor targets; pp 2 x tp 2: each stage's tp pair
      // holds its blocks' shards, the norm sums the tp-sharded squares over tp, then over pp.
      {
        INFO("parallel.pp=4");
        const Run pp4 = train_run(name, world, test::shared_dir("pp_other"), {"parallel.pp=4"});
        check_close(pp4, one, 0);
      }
      const std::vector<std::string> pptp = {"parallel.pp=2", "parallel.tp=2"};
      const Run tp = train_run(name, world, test::shared_dir("pp_other"), pptp);
      check_close(tp, one, 0);
      check_sequence_parallel(name, pptp, tp, one);
    }
    if (name == "tiny_mod") {  // its routers and predictors too; tiny_dense's blocks alike
      // Resharded across stage boundaries: pp 4's stages own other blocks than pp 2's, and each
      // reads its parameters and moments by global name. Against the pp 2 x dp 2 run's steps 3
      // and 4 to kBound (dp's bucketed mean against one sum: not bitwise).
      INFO("the step-2 checkpoint resumed at parallel.pp=4");
      const Run pp4 =
          train_run(name, world, test::shared_dir("ppdp_resumed_pp4"), {"parallel.pp=4"}, step2);
      check_close(pp4, ppdp, 2);
    }
    if (rank == 0) {  // one process is enough (the others hold the same pp 2 x dp 2 result)
      const Run resumed = train_run(name, test::self_group(), test::temp_dir("ppdp_resumed"), {}, step2);
      check_close(resumed, ppdp, 2);
    }
  }
}

// The 3-D layout, pp 2 x dp 2 x tp 2 (np8), as large models train: each stage's four ranks a
// dp pair of tp pairs, tp with sequence parallelism, ZeRO-1 over each stage's dp pair (Megatron's
// distributed optimizer: the moments sharded, the gradients reduced whole; the usual 3-D
// setting), 1F1B over 2 micro-batches. tiny_mod at d_model 64 for 3 steps, with its causal
// predictor and with AUX_BCE, against one process: every step's loss and gradient norm (and
// the predictor's, clipped apart) within SP's 1e-5 (relative: sequence-partial gradients summed
// over tp, dp's bucketed mean; measured in docs/parallel.md), the parameters too; every routed
// block's top-C choices on this dp rank's rows, per micro-batch, bitwise. Between stages each
// tp rank sends its [b, T/tp, D] part of the stream (link_shape), counted on the pp group: m
// activations forward on stage 0, m gradients back on stage 1, a step. The step-2 checkpoint
// records the layout; it resumes on one process (world rank 0) and, at once, at pp 2 x tp 2
// with SP on world ranks 0-3 and at pp 2 x dp 2 with ZeRO-1 on 4-7, each to the 3-D run's
// step 3.
TEST_CASE("pp 2 x dp 2 x tp 2 with sequence parallelism and ZeRO-1 trains as one process",
          "[mpi][pipeline]") {
  auto& world = parallel::world();
  if (world.size() != 8) return;
  const int rank = world.rank(), stage = rank / 4, dp_rank = rank / 2 % 2;
  constexpr double kSpBound = 1e-5;
  const std::string name = "tiny_mod";
  // Two halves of the world for the resumes at 4 ranks (a collective split: made once).
  static std::unique_ptr<parallel::Communicator> half = world.split(rank / 4, rank % 4, "half");
  for (const std::string causal : {"PREDICTOR", "AUX_BCE"}) {
    INFO(name << " with " << causal << ", world rank " << rank);
    const bool predictor = causal == "PREDICTOR";
    const std::vector<std::string> shape = {"train.steps=3", "model.d_model=64", "model.d_ff=256",
                                            "model.mod.causal.method=" + causal};
    std::vector<std::string> layout = shape;
    for (const char* set : {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2",
                            "parallel.sequence_parallel=true", "parallel.zero_stage=1"})
      layout.push_back(set);
    const modtrain::RunConfig cfg = recipe(name, layout);
    const int steps = cfg.train().steps();
    const Run one = reference(name, shape);
    parallel::CountingCommunicator counted(world);
    const std::string dir = test::shared_dir("pp3d");
    const Run run = train_run(name, counted, dir, layout);
    check_close(run, one, 0, kSpBound);
    double worst_loss = 0, worst_param = 0, worst_norm = 0;  // printed for docs/parallel.md
    for (size_t i = 0; i < one.losses.size(); ++i)
      worst_loss = std::max(worst_loss, std::abs(run.losses[i] - one.losses[i]) / std::abs(one.losses[i]));
    for (size_t i = 0; i < one.params.size(); ++i)
      worst_param = std::max(worst_param, test::relative_norm_diff(run.params[i].second, one.params[i].second));

    // Each stage's routed blocks on this dp rank's rows, against one process's, per micro-batch.
    const parallel::PipelinePartition part = parallel::plan_partition(cfg);
    const model::Transformer shapes(cfg.model(), 0);
    size_t first_routed = 0, stage_routed = 0;
    for (size_t b = 0; b < shapes.num_blocks(); ++b) {
      if (!shapes.routed(b)) continue;
      const int owner = part.stage_of_block(static_cast<int>(b));
      if (owner < stage) ++first_routed;
      if (owner == stage) ++stage_routed;
    }
    CHECK(stage_routed > 0);  // both stages route
    const int64_t rows_per_rank = cfg.train().batch_size() / 2;
    REQUIRE(one.routing.size() == static_cast<size_t>(steps * kMicroBatches));
    REQUIRE(run.routing.size() == one.routing.size());
    for (size_t i = 0; i < one.routing.size(); ++i) {
      INFO("step " << i / kMicroBatches + 1 << ", micro-batch " << i % kMicroBatches);
      REQUIRE(run.routing[i].size() == stage_routed);
      for (size_t k = 0; k < stage_routed; ++k) {
        INFO("routed block " << first_routed + k << " of one process's list");
        REQUIRE(run.routing[i][k].size(0) == rows_per_rank);
        test::check_bitwise(run.routing[i][k].to_vector(),
                            rows(one.routing[i][first_routed + k], dp_rank * rows_per_rank,
                                 (dp_rank + 1) * rows_per_rank));
      }
    }

    // The links carry this tp rank's part of the sequence: [b, T/tp, D] f32, one a micro-batch
    // each way (stage 0 the activations, stage 1 their gradients).
    const auto& m = cfg.model();
    const int64_t link = rows_per_rank * m.seq_len() / 2 * m.d_model() * 4;
    const parallel::CollectiveStats p2p = counted.stats().group("pp")[parallel::Collective::SendRecv];
    CHECK(p2p.calls > 0);
    CHECK(p2p.bytes_sent == int64_t{steps} * kMicroBatches * link);

    const std::string step2 = ckpt::checkpoints_dir(dir) + "/" + ckpt::step_dir_name(2);
    {
      ckpt::CheckpointReader reader(step2);
      CHECK(reader.state().mesh.pp == 2);
      CHECK(reader.state().mesh.dp == 2);
      CHECK(reader.state().mesh.tp == 2);
      CHECK(reader.state().mesh.world_size == 8);
    }
    // pp 2 x tp 2 + SP on ranks 0-3, pp 2 x dp 2 + ZeRO-1 on 4-7, from the same checkpoint.
    std::vector<std::string> four = shape;
    for (const char* set : {"parallel.pp=2", "parallel.zero_stage=1"}) four.push_back(set);
    if (rank < 4) {
      four.push_back("parallel.tp=2");
      four.push_back("parallel.sequence_parallel=true");
    } else {
      four.push_back("parallel.dp=2");
    }
    {
      INFO("resumed at " << (rank < 4 ? "pp 2 x tp 2 with SP" : "pp 2 x dp 2 with ZeRO-1"));
      check_close(train_run(name, *half, test::shared_dir("pp3d_resumed4", *half), four, step2),
                  run, 2, kSpBound);
    }
    if (rank != 0) continue;
    // Gradient norms (before clipping) per step, from world rank 0's metrics.csv.
    std::vector<std::string> columns = {"grad_norm"};
    if (predictor) columns.push_back("predictor_grad_norm");
    for (const std::string& column : columns) {
      const std::vector<double> got = test::metrics_values(dir + "/metrics.csv", column),
                                want = test::metrics_values(one.dir + "/metrics.csv", column);
      REQUIRE(want.size() == static_cast<size_t>(steps));
      REQUIRE(got.size() == want.size());
      for (size_t s = 0; s < want.size(); ++s) {
        INFO(column << ", step " << s + 1 << ": " << got[s] << " against " << want[s]);
        CHECK(std::abs(got[s] - want[s]) <= kSpBound * std::abs(want[s]));
        worst_norm = std::max(worst_norm, std::abs(got[s] - want[s]) / std::abs(want[s]));
      }
    }
    const Run resumed = train_run(name, test::self_group(), test::temp_dir("pp3d_resumed"), shape, step2);
    check_close(resumed, run, 2, kSpBound);
    std::printf("pp 2 x dp 2 x tp 2 %s (%s), sequence parallel, ZeRO-1: against one process, "
                "losses %.2e, grad norms %.2e, parameters %.2e (relative, worst of %d steps); "
                "p2p %lld B a rank\n",
                name.c_str(), causal.c_str(), worst_loss, worst_norm, worst_param, steps,
                static_cast<long long>(p2p.bytes_sent));
  }
}
