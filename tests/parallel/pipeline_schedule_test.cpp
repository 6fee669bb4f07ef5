// Pipeline schedules with no model (parallel/pipeline_schedule.h): every schedule for pp 2..8
// and m 1..16 simulated on all ranks at once (valid order, matched sends, no deadlock), 1F1B's
// in-flight bound, and the bubble of equal stages against (pp - 1) / (v x m + pp - 1).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <stdexcept>
#include <string>

#include "parallel/pipeline_schedule.h"

using namespace mod::parallel;

namespace {
// Backward takes twice the forward, as in training; chunks split a stage's time evenly.
ScheduleSimulation simulate(const PipelineSchedule& s) {
  const double v = s.virtual_stages;
  return simulate_schedule(s, StageCosts::uniform(s.pp, s.virtual_stages, 1.0 / v, 2.0 / v));
}
}  // namespace

TEST_CASE("GPipe and 1F1B: valid, deadlock-free, bubble (pp-1)/(m+pp-1) for pp 2..8, m 1..16",
          "[pipeline]") {
  for (auto kind : {PipelineScheduleKind::GPipe, PipelineScheduleKind::OneFOneB})
    for (int pp = 2; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m) {
        INFO(schedule_name(kind) << " pp " << pp << " m " << m);
        const ScheduleSimulation sim = simulate(make_schedule(kind, pp, m));
        CHECK(std::abs(sim.bubble_fraction() - predicted_bubble(pp, m)) < 1e-12);
        CHECK(sim.makespan == 3.0 * (m + pp - 1));
        if (kind == PipelineScheduleKind::GPipe) CHECK(sim.max_in_flight[0] == m);
        // 1F1B: rank r holds at most pp - r micro-batches between forward and backward.
        if (kind == PipelineScheduleKind::OneFOneB)
          for (int r = 0; r < pp; ++r) CHECK(sim.max_in_flight[r] == std::min(pp - r, m));
      }
}

TEST_CASE("interleaved 1F1B: valid for pp 2..8 and m 1..16 (multiples of pp) and v 2..4 with "
          "bubble (pp-1)/(v m+pp-1)",
          "[pipeline]") {
  for (int v = 2; v <= 4; ++v)
    for (int pp = 2; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m) {
        INFO("pp " << pp << " m " << m << " v " << v);
        if (m % pp != 0) {
          CHECK_THROWS_WITH(make_schedule(PipelineScheduleKind::Interleaved1F1B, pp, m, v),
                            "pipeline schedule interleaved-1f1b: micro-batches = " +
                                std::to_string(m) + " must be a multiple of pp = " +
                                std::to_string(pp));
          continue;
        }
        const ScheduleSimulation sim =
            simulate(make_schedule(PipelineScheduleKind::Interleaved1F1B, pp, m, v));
        CHECK(std::abs(sim.bubble_fraction() - predicted_bubble(pp, m, v)) < 1e-12);
        CHECK(sim.bubble_fraction() < predicted_bubble(pp, m) - 1e-3);
      }
}

TEST_CASE("transfer time: each link crossed by the first micro-batch's activation and the last "
          "one's gradient adds it once",
          "[pipeline]") {
  // GPipe over equal stages, forward 1 and backward 2, each tensor taking tau to arrive: the
  // forward wave reaches the last stage after (pp - 1)(1 + tau) and the gradient wave returns
  // after (pp - 1)(2 + tau), so the step is 3 (m + pp - 1) + 2 (pp - 1) tau. 1F1B pays at least
  // as much.
  for (int pp = 2; pp <= 6; ++pp)
    for (int m = 1; m <= 8; ++m)
      for (double tau : {0.0, 0.25, 1.0}) {
        INFO("pp " << pp << " m " << m << " tau " << tau);
        StageCosts costs = StageCosts::uniform(pp, 1, 1, 2);
        costs.transfer = tau;
        const auto gpipe = simulate_schedule(make_schedule(PipelineScheduleKind::GPipe, pp, m), costs);
        CHECK(gpipe.makespan == Approx(3.0 * (m + pp - 1) + 2.0 * (pp - 1) * tau));
        const auto one = simulate_schedule(make_schedule(PipelineScheduleKind::OneFOneB, pp, m), costs);
        CHECK(one.makespan >= 3.0 * (m + pp - 1) + 2.0 * (pp - 1) * tau - 1e-9);
        // The first rank runs the step's last backward; the last rank is done (pp - 1) backward
        // hops earlier.
        CHECK(one.finish[0] == Approx(one.makespan));
        CHECK(one.finish[pp - 1] == Approx(one.makespan - (pp - 1) * (2 + tau)));
      }
}

TEST_CASE("the simulation catches a schedule out of order, a lost message and a deadlock",
          "[pipeline]") {
  const StageCosts costs = StageCosts::uniform(2, 1, 1, 2);
  SECTION("backward before forward") {
    PipelineSchedule s = make_schedule(PipelineScheduleKind::OneFOneB, 2, 2);
    auto& last = s.ranks[1];  // recv, F0, B0, send, recv, F1, B1, send
    std::swap(last[1], last[2]);
    CHECK_THROWS_WITH(simulate_schedule(s, costs),
                      Catch::Contains("backward before forward"));
  }
  SECTION("receives in another order than the sends") {
    PipelineSchedule s = make_schedule(PipelineScheduleKind::GPipe, 2, 2);
    auto& last = s.ranks[1];  // recv0, F0, recv1, F1, ...
    std::swap(last[0].microbatch, last[2].microbatch);
    std::swap(last[1].microbatch, last[3].microbatch);
    CHECK_THROWS_WITH(simulate_schedule(s, costs),
                      Catch::Contains("different orders"));
  }
  SECTION("every rank waits for the other") {
    PipelineSchedule s = make_schedule(PipelineScheduleKind::GPipe, 2, 1);
    s.ranks[0].insert(s.ranks[0].begin(), {PipeOp::RecvGrad, 0, 0, 1});
    CHECK_THROWS_WITH(simulate_schedule(s, costs), Catch::Contains("deadlock"));
  }
  SECTION("a forward whose receive is missing") {
    PipelineSchedule s = make_schedule(PipelineScheduleKind::GPipe, 2, 1);
    s.ranks[1].erase(s.ranks[1].begin());  // rank 1 forgets recv activation 0
    CHECK_THROWS_WITH(simulate_schedule(s, costs),
                      Catch::Contains("before its activation arrived"));
  }
}

TEST_CASE("bad schedule arguments name themselves", "[pipeline]") {
  CHECK_THROWS_WITH(make_schedule(PipelineScheduleKind::OneFOneB, 0, 4),
                    "pipeline schedule 1f1b: pp = 0 must be >= 1");
  CHECK_THROWS_WITH(make_schedule(PipelineScheduleKind::GPipe, 2, 0),
                    "pipeline schedule gpipe: micro-batches = 0 must be >= 1");
  CHECK_THROWS_WITH(make_schedule(PipelineScheduleKind::OneFOneB, 2, 4, 2),
                    "pipeline schedule 1f1b: virtual_stages = 2 must be 1 (only "
                    "interleaved-1f1b has virtual stages)");
  CHECK_THROWS_WITH(make_schedule(PipelineScheduleKind::Interleaved1F1B, 2, 4, 1),
                    "pipeline schedule interleaved-1f1b: virtual_stages = 1 and pp = 2 must both "
                    "be >= 2");
}
