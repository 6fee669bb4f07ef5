// The issue order of a pipeline step (see pipeline_issue_order.h).
#include "parallel/pipeline_issue_order.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace mod::parallel {

namespace {

// A message by what it carries: gradient or activation, micro-batch, link (the upstream
// virtual stage of the two it connects). Unique within a step.
using Message = std::tuple<bool, int, int>;

Message message_of(const PipelineSchedule& s, int rank, const PipeAction& a) {
  const int stage = s.virtual_stage(rank, a.chunk);
  switch (a.op) {
    case PipeOp::SendActivation:
      return {false, a.microbatch, stage};
    case PipeOp::RecvActivation:
      return {false, a.microbatch, stage - 1};
    case PipeOp::SendGrad:
      return {true, a.microbatch, stage - 1};
    case PipeOp::RecvGrad:
      return {true, a.microbatch, stage};
    case PipeOp::Forward:
    case PipeOp::Backward:
      break;
  }
  throw std::logic_error("pipeline issue order: a compute action carries no message");
}

bool is_compute(PipeOp op) { return op == PipeOp::Forward || op == PipeOp::Backward; }
bool is_send(PipeOp op) { return op == PipeOp::SendActivation || op == PipeOp::SendGrad; }

}  // namespace

std::vector<std::vector<IssueStep>> issue_order(const PipelineSchedule& s) {
  const int n = s.pp;
  // Per rank: its computes in order, and for each the receives before it and sends after it
  // (a schedule puts a compute's receives directly before it and its sends directly after).
  struct Compute {
    size_t action;
    std::vector<size_t> recvs, sends;
  };
  std::vector<std::vector<Compute>> computes(n);
  for (int r = 0; r < n; ++r) {
    const std::vector<PipeAction>& actions = s.ranks.at(r);
    std::vector<size_t> pending_recvs;
    for (size_t k = 0; k < actions.size(); ++k) {
      const PipeOp op = actions[k].op;
      if (is_compute(op)) {
        computes[r].push_back({k, std::move(pending_recvs), {}});
        pending_recvs.clear();
      } else if (is_send(op)) {
        if (computes[r].empty())
          throw std::logic_error("pipeline issue order: rank " + std::to_string(r) +
                                 " sends before any compute");
        computes[r].back().sends.push_back(k);
      } else {
        pending_recvs.push_back(k);
      }
    }
    if (!pending_recvs.empty())
      throw std::logic_error("pipeline issue order: rank " + std::to_string(r) +
                             " receives after its last compute");
  }

  // Unit time steps: the round each message is sent in, each compute's step.
  std::map<Message, int> sent_in;
  std::vector<std::vector<int>> step_of(n);
  std::vector<size_t> next(n, 0);
  size_t left = 0;
  for (const auto& c : computes) left += c.size();
  const size_t max_steps = left + 1;  // a step with no compute would repeat forever
  for (int t = 0; left > 0; ++t) {
    if (static_cast<size_t>(t) > max_steps)
      for (int r = 0; r < n; ++r)
        if (next[r] < computes[r].size())
          throw std::logic_error("pipeline issue order: rank " + std::to_string(r) +
                                 " waits forever at action " +
                                 std::to_string(computes[r][next[r]].action));
    std::vector<int> ran;
    for (int r = 0; r < n; ++r) {
      if (next[r] >= computes[r].size()) continue;
      bool ready = true;
      for (size_t k : computes[r][next[r]].recvs) {
        const auto it = sent_in.find(message_of(s, r, s.ranks[r][k]));
        ready = ready && it != sent_in.end() && it->second <= t;
      }
      if (ready) ran.push_back(r);
    }
    for (int r : ran) {  // after every rank's check: a send of step t reaches step t + 1
      const Compute& c = computes[r][next[r]++];
      step_of[r].push_back(t);
      for (size_t k : c.sends) sent_in[message_of(s, r, s.ranks[r][k])] = t + 1;
      --left;
    }
  }

  std::vector<std::vector<IssueStep>> out(n);
  for (int r = 0; r < n; ++r) {
    // Each transfer's round: a send's is its compute's step + 1, a receive's its message's.
    std::map<int, std::vector<size_t>> rounds;
    for (size_t i = 0; i < computes[r].size(); ++i) {
      for (size_t k : computes[r][i].recvs)
        rounds[sent_in.at(message_of(s, r, s.ranks[r][k]))].push_back(k);
      for (size_t k : computes[r][i].sends) rounds[step_of[r][i] + 1].push_back(k);
    }
    for (auto& [round, ks] : rounds) std::sort(ks.begin(), ks.end());
    // Round t's group, then step t's compute.
    auto round = rounds.begin();
    for (size_t i = 0; i < computes[r].size(); ++i) {
      for (; round != rounds.end() && round->first <= step_of[r][i]; ++round)
        out[r].push_back({true, round->second});
      out[r].push_back({false, {computes[r][i].action}});
    }
    for (; round != rounds.end(); ++round) out[r].push_back({true, round->second});
  }
  return out;
}

}  // namespace mod::parallel
