// Pipeline schedules and their simulation (see pipeline_schedule.h).
#include "parallel/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

namespace mod::parallel {

const char* schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::GPipe: return "gpipe";
    case PipelineScheduleKind::OneFOneB: return "1f1b";
    case PipelineScheduleKind::Interleaved1F1B: return "interleaved-1f1b";
  }
  return "?";
}

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::Forward: return "forward";
    case PipeOp::Backward: return "backward";
    case PipeOp::SendActivation: return "send activation";
    case PipeOp::RecvActivation: return "recv activation";
    case PipeOp::SendGrad: return "send grad";
    case PipeOp::RecvGrad: return "recv grad";
  }
  return "?";
}

namespace {

using Unit = std::pair<int, int>;  // (micro-batch, chunk)

// Forward units in interleaved order: micro-batches in groups of pp (the last may be smaller),
// each group through chunk 0, then chunk 1, ... (Megatron's microbatch_group_size_per_vp_stage
// = pp). Backward units visit the chunks last to first.
std::vector<Unit> interleaved_units(int pp, int m, int v, bool backward) {
  std::vector<Unit> out;
  for (int g0 = 0; g0 < m; g0 += pp)
    for (int c = 0; c < v; ++c)
      for (int mb = g0; mb < std::min(m, g0 + pp); ++mb) out.push_back({mb, backward ? v - 1 - c : c});
  return out;
}

// The compute order of one rank: w warm-up forwards, then one forward and one backward in
// turn, then the remaining backwards.
std::vector<PipeAction> one_f_one_b(const std::vector<Unit>& fwd, const std::vector<Unit>& bwd,
                                    size_t warmup) {
  std::vector<PipeAction> out;
  const size_t n = fwd.size();
  warmup = std::min(warmup, n);
  for (size_t i = 0; i < warmup; ++i) out.push_back({PipeOp::Forward, fwd[i].first, fwd[i].second});
  for (size_t i = 0; i + warmup < n; ++i) {
    out.push_back({PipeOp::Forward, fwd[warmup + i].first, fwd[warmup + i].second});
    out.push_back({PipeOp::Backward, bwd[i].first, bwd[i].second});
  }
  for (size_t i = n - warmup; i < n; ++i) out.push_back({PipeOp::Backward, bwd[i].first, bwd[i].second});
  return out;
}

// Adds each compute action's receive before it and send after it.
std::vector<PipeAction> with_transfers(const PipelineSchedule& s, int rank,
                                       const std::vector<PipeAction>& compute) {
  const int last = s.pp * s.virtual_stages - 1;
  const int next = (rank + 1) % s.pp, prev = (rank + s.pp - 1) % s.pp;
  std::vector<PipeAction> out;
  for (const PipeAction& a : compute) {
    const int vs = s.virtual_stage(rank, a.chunk);
    if (a.op == PipeOp::Forward) {
      if (vs > 0) out.push_back({PipeOp::RecvActivation, a.microbatch, a.chunk, prev});
      out.push_back(a);
      if (vs < last) out.push_back({PipeOp::SendActivation, a.microbatch, a.chunk, next});
    } else {
      if (vs < last) out.push_back({PipeOp::RecvGrad, a.microbatch, a.chunk, next});
      out.push_back(a);
      if (vs > 0) out.push_back({PipeOp::SendGrad, a.microbatch, a.chunk, prev});
    }
  }
  return out;
}

}  // namespace

PipelineSchedule make_schedule(PipelineScheduleKind kind, int pp, int m, int v) {
  const std::string where = std::string("pipeline schedule ") + schedule_name(kind) + ": ";
  if (pp < 1) throw std::invalid_argument(where + "pp = " + std::to_string(pp) + " must be >= 1");
  if (m < 1)
    throw std::invalid_argument(where + "micro-batches = " + std::to_string(m) + " must be >= 1");
  if (kind == PipelineScheduleKind::Interleaved1F1B ? (v < 2 || pp < 2) : v != 1)
    throw std::invalid_argument(where + "virtual_stages = " + std::to_string(v) +
                                (kind == PipelineScheduleKind::Interleaved1F1B
                                     ? " and pp = " + std::to_string(pp) + " must both be >= 2"
                                     : " must be 1 (only interleaved-1f1b has virtual stages)"));
  // Megatron's original condition: with a smaller last group of micro-batches, its warm-up
  // count leaves rank 0 waiting for an activation that needs its own later backward.
  if (kind == PipelineScheduleKind::Interleaved1F1B && m % pp != 0)
    throw std::invalid_argument(where + "micro-batches = " + std::to_string(m) +
                                " must be a multiple of pp = " + std::to_string(pp));
  PipelineSchedule s{kind, pp, m, v, {}};
  for (int r = 0; r < pp; ++r) {
    std::vector<PipeAction> compute;
    if (kind == PipelineScheduleKind::Interleaved1F1B) {
      // Megatron's warm-up: enough forwards that rank r's first backward finds its gradient
      // on the way, 2 per rank downstream plus one group of pp per extra chunk.
      const size_t warmup = m == pp ? static_cast<size_t>(m) * v : (pp - r - 1) * 2 + (v - 1) * pp;
      compute = one_f_one_b(interleaved_units(pp, m, v, false), interleaved_units(pp, m, v, true),
                            warmup);
    } else {
      std::vector<Unit> units;
      for (int mb = 0; mb < m; ++mb) units.push_back({mb, 0});
      compute = one_f_one_b(units, units,
                            kind == PipelineScheduleKind::GPipe ? units.size() : pp - r - 1);
    }
    s.ranks.push_back(with_transfers(s, r, compute));
  }
  return s;
}

StageCosts StageCosts::uniform(int pp, int v, double forward, double backward) {
  StageCosts c;
  c.forward.assign(pp, std::vector<double>(v, forward));
  c.backward.assign(pp, std::vector<double>(v, backward));
  return c;
}

double ScheduleSimulation::bubble_fraction() const {
  double busy_sum = 0;
  for (double b : busy) busy_sum += b;
  const double total = makespan * static_cast<double>(busy.size());
  return total > 0 ? (total - busy_sum) / total : 0;
}

ScheduleSimulation simulate_schedule(const PipelineSchedule& s, const StageCosts& costs) {
  const int pp = s.pp, v = s.virtual_stages, m = s.microbatches, last = pp * v - 1;
  if (static_cast<int>(s.ranks.size()) != pp || static_cast<int>(costs.forward.size()) != pp ||
      static_cast<int>(costs.backward.size()) != pp)
    throw std::invalid_argument("simulate_schedule: schedule and costs must have pp = " +
                                std::to_string(pp) + " ranks");
  struct Message { int microbatch, from_stage; double time; };
  // (sender, receiver, is gradient) -> tensors in flight, in send order.
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels;
  std::vector<size_t> next(pp, 0);
  std::vector<double> clock(pp, 0.0);
  ScheduleSimulation out;
  out.busy.assign(pp, 0.0);
  out.max_in_flight.assign(pp, 0);
  std::vector<int> in_flight(pp, 0);
  // Per rank: units forwarded, backwarded, whose input / gradient arrived; last backward per chunk.
  std::vector<std::set<Unit>> fwd(pp), bwd(pp), got_act(pp), got_grad(pp);
  std::vector<std::vector<int>> last_bwd(pp, std::vector<int>(v, -1));

  auto fail = [&](int r, const PipeAction& a, const std::string& why) {
    throw std::logic_error(std::string(schedule_name(s.kind)) + " pp=" + std::to_string(pp) +
                           " m=" + std::to_string(m) + " v=" + std::to_string(v) + ": rank " +
                           std::to_string(r) + " action " + std::to_string(next[r]) + " (" +
                           pipe_op_name(a.op) + " micro-batch " + std::to_string(a.microbatch) +
                           " chunk " + std::to_string(a.chunk) + "): " + why);
  };
  // Runs rank r's next action if it can; false when it waits for a message (or is done).
  auto step = [&](int r) -> bool {
    if (next[r] >= s.ranks[r].size()) return false;
    const PipeAction& a = s.ranks[r][next[r]];
    if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v)
      fail(r, a, "micro-batch or chunk out of range");
    const int vs = s.virtual_stage(r, a.chunk);
    const Unit u{a.microbatch, a.chunk};
    const int next_rank = (r + 1) % pp, prev_rank = (r + pp - 1) % pp;
    switch (a.op) {
      case PipeOp::Forward:
        if (fwd[r].count(u)) fail(r, a, "forward twice");
        if (vs > 0 && !got_act[r].count(u)) fail(r, a, "forward before its activation arrived");
        fwd[r].insert(u);
        clock[r] += costs.forward[r][a.chunk];
        out.busy[r] += costs.forward[r][a.chunk];
        out.max_in_flight[r] = std::max(out.max_in_flight[r], ++in_flight[r]);
        break;
      case PipeOp::Backward:
        if (!fwd[r].count(u)) fail(r, a, "backward before forward on this rank");
        if (bwd[r].count(u)) fail(r, a, "backward twice");
        if (vs < last && !got_grad[r].count(u)) fail(r, a, "backward before its gradient arrived");
        if (a.microbatch != last_bwd[r][a.chunk] + 1)
          fail(r, a, "backwards of a chunk out of micro-batch order");
        last_bwd[r][a.chunk] = a.microbatch;
        bwd[r].insert(u);
        --in_flight[r];
        clock[r] += costs.backward[r][a.chunk];
        out.busy[r] += costs.backward[r][a.chunk];
        break;
      case PipeOp::SendActivation:
      case PipeOp::SendGrad: {
        const bool grad = a.op == PipeOp::SendGrad;
        if (grad ? (vs == 0 || a.peer != prev_rank) : (vs == last || a.peer != next_rank))
          fail(r, a, "sends to the wrong rank or past the pipeline's end");
        if (!(grad ? bwd[r] : fwd[r]).count(u)) fail(r, a, "sends what it has not computed");
        channels[{r, a.peer, grad}].push_back({a.microbatch, vs, clock[r]});
        break;
      }
      case PipeOp::RecvActivation:
      case PipeOp::RecvGrad: {
        const bool grad = a.op == PipeOp::RecvGrad;
        if (grad ? (vs == last || a.peer != next_rank) : (vs == 0 || a.peer != prev_rank))
          fail(r, a, "receives from the wrong rank or past the pipeline's end");
        auto& q = channels[{a.peer, r, grad}];
        if (q.empty()) return false;
        const Message msg = q.front();
        if (msg.microbatch != a.microbatch || msg.from_stage != (grad ? vs + 1 : vs - 1))
          fail(r, a, "the channel's next tensor is micro-batch " + std::to_string(msg.microbatch) +
                         " of virtual stage " + std::to_string(msg.from_stage) +
                         ": sends and receives are in different orders");
        q.pop_front();
        (grad ? got_grad[r] : got_act[r]).insert(u);
        clock[r] = std::max(clock[r], msg.time + costs.transfer);
        break;
      }
    }
    ++next[r];
    return true;
  };

  for (;;) {
    bool progress = false;
    for (int r = 0; r < pp; ++r)
      while (step(r)) progress = true;
    if (progress) continue;
    for (int r = 0; r < pp; ++r)
      if (next[r] < s.ranks[r].size()) fail(r, s.ranks[r][next[r]], "deadlock: waits forever");
    break;
  }
  for (int r = 0; r < pp; ++r)
    if (static_cast<int>(bwd[r].size()) != m * v)
      throw std::logic_error(std::string(schedule_name(s.kind)) + ": rank " + std::to_string(r) +
                             " ran " + std::to_string(bwd[r].size()) + " backwards, expected " +
                             std::to_string(m * v));
  for (const auto& [key, q] : channels)
    if (!q.empty())
      throw std::logic_error(std::string(schedule_name(s.kind)) + ": rank " +
                             std::to_string(std::get<0>(key)) + " sent a tensor rank " +
                             std::to_string(std::get<1>(key)) + " never receives");
  out.finish = clock;
  out.makespan = *std::max_element(clock.begin(), clock.end());
  return out;
}

double predicted_bubble(int pp, int microbatches, int virtual_stages) {
  return (pp - 1.0) / (static_cast<double>(virtual_stages) * microbatches + pp - 1.0);
}

}  // namespace mod::parallel
