// Stage partition by predicted cost (parallel/pipeline_partition.h): the dynamic programme
// against brute force, a MoD model whose cost partition beats the equal block count, the
// hand-written parallel.pp_layout and its errors, and the table `flops` and `memory` print.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>

#include "configs/config.h"
#include "model/flops.h"
#include "model/memory_plan.h"
#include "parallel/pipeline_memory.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_runtime.h"

using namespace mod;
using parallel::balance_blocks;

namespace {
modtrain::RunConfig recipe(const std::string& name, const std::vector<std::string>& sets) {
  const char* src = std::getenv("MOD_SOURCE_DIR");
  return config::load(std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/" + name +
                          ".textproto",
                      sets);
}

// The largest stage of every contiguous split into `stages` non-empty groups, the smallest of them.
double brute_force_best(const std::vector<double>& cost, double head, int stages) {
  const int n = static_cast<int>(cost.size());
  double best = 1e300;
  std::function<void(int, int, double)> go = [&](int start, int left, double worst) {
    if (left == 1) {
      double c = head;
      for (int i = start; i < n; ++i) c += cost[i];
      best = std::min(best, std::max(worst, c));
      return;
    }
    double c = 0;
    for (int end = start + 1; end <= n - (left - 1); ++end) {
      c += cost[end - 1];
      go(end, left - 1, std::max(worst, c));
    }
  };
  go(0, stages, 0);
  return best;
}

double largest_stage(const std::vector<double>& cost, double head, const std::vector<int>& blocks) {
  double worst = 0;
  size_t b = 0;
  for (size_t s = 0; s < blocks.size(); ++s) {
    double c = s + 1 == blocks.size() ? head : 0;
    for (int k = 0; k < blocks[s]; ++k) c += cost[b++];
    worst = std::max(worst, c);
  }
  REQUIRE(b == cost.size());
  return worst;
}
}  // namespace

TEST_CASE("balance_blocks finds the smallest slowest stage (brute force, 1..9 blocks)",
          "[pipeline]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.05, 3.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 9;
    std::vector<double> cost(n);
    for (double& c : cost) c = u(rng);
    const double head = trial % 3 == 0 ? 0.0 : u(rng);
    for (int stages = 1; stages <= n; ++stages) {
      INFO("trial " << trial << " blocks " << n << " stages " << stages);
      const std::vector<int> split = balance_blocks(cost, head, stages);
      REQUIRE(static_cast<int>(split.size()) == stages);
      for (int k : split) CHECK(k >= 1);
      CHECK(largest_stage(cost, head, split) == brute_force_best(cost, head, stages));
    }
  }
  CHECK(balance_blocks({1, 1, 1, 1}, 2.0, 2) == std::vector<int>{3, 1});  // the head weighs
  CHECK(parallel::equal_block_counts(7, 3) == std::vector<int>{3, 2, 2});
}

TEST_CASE("the cost partition of a MoD model balances better than an equal block count",
          "[pipeline]") {
  // tiny_mod with its routed blocks last (3, 4, 5 at 12.5%): three blocks per stage would put
  // the three dense ones on stage 0.
  const modtrain::RunConfig cfg = recipe(
      "tiny_mod", {"model.mod.schedule=EXPLICIT", "model.mod.routed_blocks=[3, 4, 5]", "parallel.pp=2"});
  const parallel::PipelinePartition cost = parallel::plan_partition(cfg);
  const parallel::PipelinePartition equal =
      parallel::partition_with(cfg.model(), 2, 1, parallel::equal_block_counts(6, 2), false);
  CHECK(cost.blocks == std::vector<int>{2, 4});
  CHECK(equal.blocks == std::vector<int>{3, 3});
  const double total = cost.forward_per_token[0] + cost.forward_per_token[1];
  INFO("slowest / mean: cost " << cost.largest() / (total / 2) << ", equal "
                               << equal.largest() / (total / 2));
  CHECK(cost.largest() < 0.8 * equal.largest());
  // Every recipe shape at pp 2 and 3: never worse than the equal count.
  for (const char* name : {"tiny_dense", "tiny_mod"})
    for (int pp : {2, 3}) {
      const modtrain::RunConfig c = recipe(name, {"parallel.pp=" + std::to_string(pp)});
      INFO(name << " pp " << pp);
      CHECK(parallel::plan_partition(c).largest() <=
            parallel::partition_with(c.model(), pp, 1, parallel::equal_block_counts(6, pp), false)
                .largest());
    }
}

TEST_CASE("parallel.pp_layout overrides the partition and bad layouts name the field",
          "[pipeline]") {
  const auto part = parallel::plan_partition(
      recipe("tiny_mod", {"parallel.pp=2", "parallel.pp_layout=[5, 1]"}));
  CHECK(part.by_hand);
  CHECK(part.blocks == std::vector<int>{5, 1});
  CHECK(part.stage_of_block(4) == 0);
  CHECK(part.stage_of_block(5) == 1);
  const model::FlopCount f = model::count_flops(recipe("tiny_mod", {}).model());
  CHECK(part.forward_per_token[1] == f.blocks[5].forward_per_token + f.lm_head_per_token);

  auto error_of = [](const std::vector<std::string>& sets) {
    try {
      recipe("tiny_mod", sets);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using Catch::Contains;
  CHECK_THAT(error_of({"parallel.pp=2", "parallel.pp_layout=[3, 2]"}),
             Contains("parallel.pp_layout: sums to 5 blocks, expected model.n_layers 6"));
  CHECK_THAT(error_of({"parallel.pp=2", "parallel.pp_layout=[6]"}),
             Contains("parallel.pp_layout: has 1 entries, expected parallel.pp x "
                      "parallel.virtual_stages = 2"));
  CHECK_THAT(error_of({"parallel.pp=2", "parallel.pp_layout=[6, 0]"}),
             Contains("parallel.pp_layout[1]: 0 must be >= 1"));
  CHECK_THAT(error_of({"parallel.pp=7"}), Contains("more than model.n_layers 6"));
  CHECK_THAT(error_of({"parallel.pp=0"}), Contains("parallel.pp: 0 must be >= 1"));
  CHECK_THAT(error_of({"parallel.pp=2", "parallel.virtual_stages=2"}),
             Contains("parallel.virtual_stages: 2 must be 1 unless parallel.pp_schedule is "
                      "INTERLEAVED_1F1B"));
  CHECK_THAT(error_of({"parallel.pp=2", "parallel.pp_schedule=INTERLEAVED_1F1B",
                       "parallel.virtual_stages=2", "train.grad_accum=3"}),
             Contains("train.grad_accum: 3 (micro-batches) must be a multiple of parallel.pp 2"));
}

TEST_CASE("flops and memory print the partition, stage costs, memory and bubble", "[pipeline]") {
  CHECK(parallel::describe_pipeline(recipe("tiny_mod", {})).empty());
  const std::string table = parallel::describe_pipeline(
      recipe("tiny_mod", {"parallel.pp=2", "parallel.pp_schedule=INTERLEAVED_1F1B",
                          "parallel.virtual_stages=2", "train.grad_accum=4"}));
  INFO(table);
  CHECK_THAT(table, Catch::Contains("pp 2, interleaved-1f1b, 2 virtual stage(s) per rank, 4 micro-batches"));
  CHECK_THAT(table, Catch::Contains("balanced by predicted forward+backward FLOPs"));
  CHECK_THAT(table, Catch::Contains("(pp-1)/(v m+pp-1) = 0.1111 for equal stages"));
  CHECK_THAT(table, Catch::Contains("    3     1"));  // virtual stage 3 runs on rank 1
  CHECK_THAT(table, Catch::Contains("memory per rank (predicted;"));
  // Per device under pp 2 x dp 2 x tp 2: pp rank r is world ranks 4r..4r+3, and the ranks' FLOPs
  // times dp x tp are one process's step (3 x forward a token, 8 x 256 tokens a micro-batch).
  const modtrain::RunConfig grid = recipe(
      "tiny_mod", {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2", "train.grad_accum=4",
                   "parallel.pp_schedule=INTERLEAVED_1F1B", "parallel.virtual_stages=2"});
  const std::vector<double> per_rank = parallel::rank_step_flops(grid);
  REQUIRE(per_rank.size() == 2);
  CHECK((per_rank[0] + per_rank[1]) * 4 ==
        Approx(model::count_flops(grid.model()).training_per_token * 8 * 256 * 4));
  const std::string grid_table = parallel::describe_pipeline(grid);
  INFO(grid_table);
  CHECK_THAT(grid_table, Catch::Contains("compute per device a step"));
  CHECK_THAT(grid_table, Catch::Contains("      1          4-7     1,3"));
}

// pp 4 interleaved, pipeline_interleaved_tests' tiny_mod (width 64, 8 micro-batches of 4 x 64):
// every rank holds at least one receive buffer [4, 64, 64] f32 posted before the compute that
// reads it, and some rank several at once (the issue order posts a receive in its sender's round,
// computes ahead); the last rank's peak is the fused LM head's forward of the last micro-batch,
// where the CPU allocator's peak falls too (docs/parallel.md, "The pipeline planner's terms").
TEST_CASE("pipeline memory: receive buffers posted ahead, the fused head's chunk", "[pipeline]") {
  const modtrain::RunConfig cfg = recipe(
      "tiny_mod", {"model.n_layers=8", "model.d_model=64", "model.d_ff=256", "model.seq_len=64",
                   "train.batch_size=4", "train.grad_accum=8", "parallel.pp=4",
                   "parallel.pp_schedule=INTERLEAVED_1F1B", "parallel.virtual_stages=2"});
  const double link = 4.0 * 4 * 64 * 64;
  const auto ranks = parallel::plan_pipeline_memory(cfg);
  double most = 0;
  for (const auto& r : ranks) {
    INFO("rank " << r.rank);
    CHECK(r.receives >= link);
    most = std::max(most, r.receives);
  }
  CHECK(most >= 2 * link);
  CHECK(ranks[3].peak_at == "forward of the fused LM head of micro-batch 7");
}

TEST_CASE("interleaved: rank r owns virtual stages r, r + pp, ... (stage_owns)", "[pipeline]") {
  // tiny_dense at 8 blocks, pp 2 x v 2 by hand: virtual stages of 1, 3, 2, 2 blocks.
  const modtrain::RunConfig cfg =
      recipe("tiny_dense", {"model.n_layers=8", "parallel.pp=2", "parallel.virtual_stages=2",
                            "parallel.pp_schedule=INTERLEAVED_1F1B", "train.grad_accum=4",
                            "parallel.pp_layout=[1, 3, 2, 2]"});
  const parallel::PipelinePartition part = parallel::plan_partition(cfg);
  REQUIRE(part.stages() == 4);
  const int want_rank[] = {0, 1, 1, 1, 0, 0, 1, 1};  // blocks 0 | 1-3 | 4-5 | 6-7
  for (int b = 0; b < 8; ++b) {
    INFO("block " << b);
    CHECK(part.rank_of(part.stage_of_block(b)) == want_rank[b]);
    const std::string name = "blocks." + std::to_string(b) + ".norm1.weight";
    CHECK(parallel::stage_owns(part, want_rank[b], name, false));
    CHECK_FALSE(parallel::stage_owns(part, 1 - want_rank[b], name, false));
  }
  // The embedding on virtual stage 0 (rank 0), the head on the last (rank 1).
  CHECK(parallel::stage_owns(part, 0, "embed.weight", false));
  CHECK_FALSE(parallel::stage_owns(part, 1, "embed.weight", false));
  CHECK(parallel::stage_owns(part, 1, "embed.weight", true));
  CHECK(parallel::stage_owns(part, 1, "final_norm.weight", false));
  CHECK_FALSE(parallel::stage_owns(part, 0, "final_norm.weight", false));
}

// The per-rank pipeline planner's rules (memory_layout_tests measures them): every rank holds
// only the parameters it owns (the tied embedding on both ends); 1F1B keeps pp - r micro-batches in flight on rank r (m >= pp);
// ZeRO-1 and ZeRO-2 shrink every rank's peak, ZeRO-3 holds its own units' slices and gathered
// units; predicted_peak is the fullest rank's.
TEST_CASE("pipeline memory per rank: owned parameters, in-flight activations, ZeRO", "[pipeline]") {
  const std::vector<std::string> pp2 = {"parallel.pp=2", "parallel.dp=2", "train.grad_accum=4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), pp2.begin(), pp2.end());
    return recipe("tiny_dense", extra);
  };
  const modtrain::RunConfig cfg = with({});
  const model::MemoryPlan whole = model::plan_memory(cfg);
  const auto ranks = parallel::plan_pipeline_memory(cfg);
  REQUIRE(ranks.size() == 2);
  double block = 0;
  for (const model::BlockMemory& b : whole.blocks) block = std::max(block, b.kept);
  for (const auto& r : ranks) {
    INFO("rank " << r.rank);
    CHECK(r.parameters == Approx(r.owned));
    CHECK(r.parameters < whole.parameters);
  }
  REQUIRE(cfg.model().tie_embeddings());  // held by both ends
  CHECK(ranks[0].parameters + ranks[1].parameters ==
        Approx(whole.parameters + whole.embedding_parameters));
  CHECK(ranks[0].activations == Approx(2 * 3 * block));  // 2 micro-batches of blocks 0-2
  CHECK(ranks[1].activations == Approx(3 * block + whole.head_kept));
  CHECK(parallel::predicted_peak(cfg) == std::max(ranks[0].peak, ranks[1].peak));
  const auto zero1 = parallel::plan_pipeline_memory(with({"parallel.zero_stage=1"}));
  const auto zero2 = parallel::plan_pipeline_memory(with({"parallel.zero_stage=2"}));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(zero1[r].peak < ranks[r].peak);
    CHECK(zero2[r].peak < zero1[r].peak);
    CHECK(zero1[r].optimizer == Approx(ranks[r].owned));  // m and v of half the owned
  }
  // ZeRO-3: the stage's own units sharded (the moments as at stage 2), a block whole and the next
  // in flight, the outer unit whole on the ends only (pp 4's middle ranks hold none of it); no
  // all-gather after the update; `memory` prints the table.
  const auto zero3 = parallel::plan_pipeline_memory(with({"parallel.zero_stage=3"}));
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(zero3[r].optimizer == Approx(zero2[r].optimizer));
    CHECK(zero3[r].peak_at != "ZeRO all-gather");
  }
  const model::MemoryPlan blocks = model::plan_memory(cfg);
  const auto pp4 = parallel::plan_pipeline_memory(recipe(
      "tiny_dense", {"parallel.pp=4", "parallel.dp=2", "train.grad_accum=4", "model.n_layers=8",
                     "parallel.zero_stage=3"}));
  const double gathered = 2.5 * blocks.blocks[0].parameters;  // every block the same size
  for (int r : {1, 2}) {
    INFO("pp 4, middle rank " << r);
    CHECK(pp4[r].parameters == Approx(pp4[r].owned / 2 + gathered));
  }
  CHECK(pp4[0].parameters == Approx(pp4[0].owned / 2 + blocks.embedding_parameters + gathered));
  CHECK_THAT(parallel::describe_pipeline(with({"parallel.zero_stage=3"})),
             Catch::Contains("memory per rank (predicted;"));
  CHECK(parallel::predicted_peak(recipe("tiny_dense", {})) == model::plan_memory(recipe("tiny_dense", {})).peak);
  CHECK_THROWS_WITH(parallel::plan_pipeline_memory(recipe("tiny_dense", {})),
                    Catch::Contains("parallel.pp is 1"));
}
