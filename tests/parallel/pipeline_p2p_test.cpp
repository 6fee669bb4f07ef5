// A pipeline step's transfers under NCCL's point-to-point rules, with no model: every schedule
// for pp 2..8 and m 1..16 (interleaved: v 2..4, m a multiple of pp) runs to completion and each
// receive gets the message its sender meant (same direction, micro-batch and link), issued as
// run_stage_step issues them (issue_order: each round one Communicator::send_recv, one group).
// The same transfers one call each deadlock 1F1B, and grouped only where adjacent in the
// schedule they deadlock interleaved 1F1B (m > pp): the test tells them apart. And, with a tiny
// model, the runtime issues exactly those rounds: run_stage_step on each rank alone, recorded.
//
// The rules (NCCL User Guide, "Point-to-point communication" and "Group Calls"):
// - NCCL has no tags: between two ranks, sends match receives in call order;
// - a send may not complete until its peer has posted the matching receive (rendezvous);
// - all operations of a communicator run in order on its stream, so a rank's next call starts
//   only when its previous one is complete;
// - the operations of one ncclGroupStart/End progress together: the group is complete once
//   each of them is matched.
// Compute never blocks here: a rank issues its next group right after the compute between, and
// that compute needs only the receives of the groups before it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "configs/config.h"
#include "parallel/communicator.h"
#include "parallel/pipeline_issue_order.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_runtime.h"
#include "parallel/pipeline_schedule.h"

using namespace mod::parallel;
using mod::Tensor;

namespace {

// What a transfer carries: activation or gradient, of which micro-batch, over which link
// (the upstream virtual stage of the pair it connects).
struct Message {
  bool grad = false;
  int microbatch = 0, link = 0;
  bool operator==(const Message&) const = default;
};

struct Transfer {
  bool send = false;
  int peer = 0;
  Message message;  // a receive's: what its rank expects
};
using Group = std::vector<Transfer>;

Transfer transfer_of(const PipelineSchedule& s, int rank, const PipeAction& a) {
  const int stage = s.virtual_stage(rank, a.chunk);
  switch (a.op) {
    case PipeOp::SendActivation:
      return {true, a.peer, {false, a.microbatch, stage}};
    case PipeOp::RecvActivation:
      return {false, a.peer, {false, a.microbatch, stage - 1}};
    case PipeOp::SendGrad:
      return {true, a.peer, {true, a.microbatch, stage - 1}};
    case PipeOp::RecvGrad:
      return {false, a.peer, {true, a.microbatch, stage}};
    default:
      FAIL("not a transfer: " << pipe_op_name(a.op));
  }
  return {};
}

enum class Grouping { Rounds, Adjacent, None };

// Each rank's groups in issue order: the runtime's rounds (issue_order); each run of adjacent
// transfers in the schedule; or one call per transfer in schedule order.
std::vector<std::vector<Group>> groups_of(const PipelineSchedule& s, Grouping grouping) {
  std::vector<std::vector<Group>> out(s.pp);
  if (grouping == Grouping::Rounds) {
    const std::vector<std::vector<IssueStep>> order = issue_order(s);
    for (int r = 0; r < s.pp; ++r)
      for (const IssueStep& step : order[r]) {
        if (!step.transfers) continue;
        out[r].emplace_back();
        for (size_t k : step.actions) out[r].back().push_back(transfer_of(s, r, s.ranks[r][k]));
      }
    return out;
  }
  for (int r = 0; r < s.pp; ++r) {
    bool after_transfer = false;
    for (const PipeAction& a : s.ranks[r]) {
      const bool compute = a.op == PipeOp::Forward || a.op == PipeOp::Backward;
      if (!compute) {
        if (grouping == Grouping::None || !after_transfer) out[r].emplace_back();
        out[r].back().push_back(transfer_of(s, r, a));
      }
      after_transfer = !compute;
    }
  }
  return out;
}

// Runs the ranks' groups under the rules above. Empty when every group completed and every
// message reached the receive that expected it; else what went wrong.
std::string run_under_nccl_rules(const std::vector<std::vector<Group>>& groups) {
  const int n = static_cast<int>(groups.size());
  // Per ordered pair (from, to): the sends posted so far, and the receives posted so far.
  std::vector<std::vector<std::vector<Message>>> sent(n, std::vector<std::vector<Message>>(n)),
      expected = sent;
  std::vector<size_t> head(n, 0);
  // Each posted transfer's place in its pair's order: (rank, group, index) -> sequence number.
  std::vector<std::vector<std::vector<size_t>>> seq(n);
  auto post = [&](int r) {
    if (head[r] >= groups[r].size()) return;
    seq[r].emplace_back();
    for (const Transfer& t : groups[r][head[r]]) {
      auto& queue = t.send ? sent[r][t.peer] : expected[t.peer][r];
      seq[r].back().push_back(queue.size());
      queue.push_back(t.message);
    }
  };
  for (int r = 0; r < n; ++r) post(r);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < n; ++r) {
      if (head[r] >= groups[r].size()) continue;
      const Group& g = groups[r][head[r]];
      bool complete = true;
      for (size_t k = 0; k < g.size(); ++k) {
        const Transfer& t = g[k];
        const size_t at = seq[r][head[r]][k];
        const auto& other = t.send ? expected[r][t.peer] : sent[t.peer][r];
        if (other.size() <= at) {
          complete = false;  // the peer has not posted its side yet
          continue;
        }
        const Message& m = t.send ? t.message : other[at];
        const Message& want = t.send ? other[at] : t.message;
        if (!(m == want))
          return "rank " + std::to_string(r) + " " + (t.send ? "sent" : "received") + " " +
                 (m.grad ? "gradient" : "activation") + " of micro-batch " +
                 std::to_string(m.microbatch) + " on link " + std::to_string(m.link) +
                 " where " + (want.grad ? "a gradient" : "an activation") + " of micro-batch " +
                 std::to_string(want.microbatch) + " on link " + std::to_string(want.link) +
                 " was expected";
      }
      if (!complete) continue;
      ++head[r];
      post(r);
      moved = true;
    }
  }
  for (int r = 0; r < n; ++r)
    if (head[r] < groups[r].size())
      return "deadlock: rank " + std::to_string(r) + " stuck at its group " +
             std::to_string(head[r]) + " of " + std::to_string(groups[r].size());
  return "";
}

// Rank `rank` of a pp group of `size`, run alone: each send_recv is recorded as one Group
// (its receives filled with zeros), the CPU step's closing barrier returns at once, and any
// other call is an error (run_stage_step makes none).
class RecordingPeers final : public Communicator {
 public:
  RecordingPeers(int rank, int size) : rank_(rank), size_(size) {}
  std::vector<Group> calls;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  std::unique_ptr<Work> send_recv(const std::vector<PeerTransfer>& transfers) override {
    calls.emplace_back();
    for (const PeerTransfer& t : transfers) {
      calls.back().push_back({t.kind == PeerTransfer::Send, t.peer, {}});
      if (t.kind == PeerTransfer::Recv) std::memset(t.tensor.raw_data(), 0, t.tensor.nbytes());
    }
    return std::make_unique<Done>();
  }
  void barrier() override {}
  void all_reduce(const Tensor&, ReduceOp) override { unused("all_reduce"); }
  std::unique_ptr<Work> all_reduce_async(const Tensor&, ReduceOp) override { unused("all_reduce_async"); }
  void reduce_scatter(const Tensor&, const Tensor&, ReduceOp) override { unused("reduce_scatter"); }
  std::unique_ptr<Work> reduce_scatter_async(const Tensor&, const Tensor&, ReduceOp) override {
    unused("reduce_scatter_async");
  }
  void all_gather(const Tensor&, const Tensor&) override { unused("all_gather"); }
  void all_to_all(const Tensor&, const Tensor&) override { unused("all_to_all"); }
  void broadcast(const Tensor&, int) override { unused("broadcast"); }
  void send(const Tensor&, int, int) override { unused("send"); }
  void recv(const Tensor&, int, int) override { unused("recv"); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { unused("split"); }
  [[noreturn]] void abort(const std::string& message, int) override { throw std::runtime_error(message); }

 private:
  struct Done final : Work {
    void wait() override {}
    bool test() override { return true; }
  };
  [[noreturn]] static void unused(const char* what) {
    throw std::logic_error(std::string("RecordingPeers: run_stage_step called ") + what);
  }
  int rank_, size_;
  std::string name_ = "pp";
};

}  // namespace

// Every schedule: pp 2..8, m 1..16, interleaved v 2..4.
TEST_CASE("pipeline transfers in rounds complete under NCCL's point-to-point rules", "[pipeline]") {
  int runs = 0;
  for (int pp = 2; pp <= 8; ++pp)
    for (int m = 1; m <= 16; ++m) {
      std::vector<std::tuple<PipelineScheduleKind, int>> kinds = {
          {PipelineScheduleKind::GPipe, 1}, {PipelineScheduleKind::OneFOneB, 1}};
      if (m % pp == 0)
        for (int v = 2; v <= 4; ++v) kinds.emplace_back(PipelineScheduleKind::Interleaved1F1B, v);
      for (const auto& [kind, v] : kinds) {
        INFO(schedule_name(kind) << " pp " << pp << " m " << m << " v " << v);
        const PipelineSchedule s = make_schedule(kind, pp, m, v);
        CHECK(run_under_nccl_rules(groups_of(s, Grouping::Rounds)) == "");
        ++runs;
      }
    }
  CHECK(runs == 2 * 7 * 16 + 3 * (8 + 5 + 4 + 3 + 2 + 2 + 2));  // m multiples of pp 2..8
}

// One NCCL call per transfer deadlocks 1F1B; groups of adjacent transfers deadlock interleaved
// 1F1B; rounds do neither.
TEST_CASE("pipeline transfers one call each or grouped only when adjacent deadlock", "[pipeline]") {
  // pp 2, m 2: rank 0 sends activation 1 then receives gradient 0; rank 1 sends gradient 0
  // then receives activation 1. Each send waits for a receive its peer posts after its own send.
  const PipelineSchedule one_f_one_b = make_schedule(PipelineScheduleKind::OneFOneB, 2, 2);
  CHECK_THAT(run_under_nccl_rules(groups_of(one_f_one_b, Grouping::None)),
             Catch::StartsWith("deadlock: rank 0 stuck"));
  CHECK(run_under_nccl_rules(groups_of(one_f_one_b, Grouping::Adjacent)) == "");
  CHECK(run_under_nccl_rules(groups_of(one_f_one_b, Grouping::Rounds)) == "");
  // pp 2, m 4, v 2: the two ranks exchange both ways over two links; rank 0's gradient send
  // (alone after its backward) waits for a receive rank 1 posts only after rank 1's own
  // gradient send, which waits for a receive rank 0 posts after that.
  const PipelineSchedule interleaved =
      make_schedule(PipelineScheduleKind::Interleaved1F1B, 2, 4, 2);
  CHECK_THAT(run_under_nccl_rules(groups_of(interleaved, Grouping::Adjacent)),
             Catch::StartsWith("deadlock"));
  CHECK(run_under_nccl_rules(groups_of(interleaved, Grouping::Rounds)) == "");
  // Messages matched in call order: a receiver expecting another micro-batch is named.
  std::vector<std::vector<Group>> swapped =
      groups_of(make_schedule(PipelineScheduleKind::GPipe, 2, 2), Grouping::Adjacent);
  std::swap(swapped[1][0], swapped[1][1]);  // rank 1 receives activation 1 first
  CHECK_THAT(run_under_nccl_rules(swapped),
             Catch::Contains("sent activation of micro-batch 0 on link 0 where an activation of "
                             "micro-batch 1 on link 0 was expected"));
}

// Each rank's computes in schedule order, each transfer once, a receive before its compute and
// a send after it.
TEST_CASE("issue_order keeps the schedule's computes and each transfer's side", "[pipeline]") {
  for (const auto& [kind, pp, m, v] :
       {std::tuple{PipelineScheduleKind::OneFOneB, 4, 8, 1},
        std::tuple{PipelineScheduleKind::GPipe, 3, 5, 1},
        std::tuple{PipelineScheduleKind::Interleaved1F1B, 4, 8, 3}}) {
    const PipelineSchedule s = make_schedule(kind, pp, m, v);
    const std::vector<std::vector<IssueStep>> order = issue_order(s);
    REQUIRE(order.size() == static_cast<size_t>(pp));
    for (int r = 0; r < pp; ++r) {
      INFO(schedule_name(kind) << " rank " << r);
      std::vector<size_t> position(s.ranks[r].size(), SIZE_MAX), computes;
      size_t at = 0;
      for (const IssueStep& step : order[r]) {
        for (size_t k : step.actions) {
          CHECK(position[k] == SIZE_MAX);
          position[k] = at;
        }
        if (!step.transfers) computes.push_back(step.actions.at(0));
        ++at;
      }
      for (size_t k = 0; k < s.ranks[r].size(); ++k) {
        const PipeOp op = s.ranks[r][k].op;
        REQUIRE(position[k] != SIZE_MAX);
        if (op == PipeOp::RecvActivation || op == PipeOp::RecvGrad) CHECK(position[k] < position[k + 1]);
        if (op == PipeOp::SendActivation || op == PipeOp::SendGrad) CHECK(position[k] > position[k - 1]);
      }
      CHECK(std::is_sorted(computes.begin(), computes.end()));
    }
  }
}

// The runtime itself, not only issue_order: run_stage_step on each rank of a tiny dense model
// (one block a virtual stage) issues exactly the rounds, each one send_recv with the round's
// transfers (side and peer) in order. Split into one call a transfer, 1F1B would deadlock on
// NCCL (above), which NCCL's emulated stand-in cannot show: its sends never wait.
TEST_CASE("run_stage_step issues each round as one send_recv", "[pipeline]") {
  const char* src = std::getenv("MOD_SOURCE_DIR");
  for (const auto& [kind, pp, m, v] :
       {std::tuple{PipelineScheduleKind::OneFOneB, 2, 2, 1},
        std::tuple{PipelineScheduleKind::Interleaved1F1B, 2, 4, 2},
        std::tuple{PipelineScheduleKind::Interleaved1F1B, 4, 4, 2}}) {
    const modtrain::RunConfig cfg = mod::config::load(
        std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/tiny_dense.textproto",
        {"model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.seq_len=8",
         "model.n_layers=" + std::to_string(pp * v), "parallel.pp=" + std::to_string(pp),
         "parallel.virtual_stages=" + std::to_string(v), "train.grad_accum=" + std::to_string(m),
         std::string("parallel.pp_schedule=") +
             (v > 1 ? "INTERLEAVED_1F1B" : "ONE_F_ONE_B")});
    const PipelineSchedule s = make_schedule(kind, pp, m, v);
    const PipelinePartition part = plan_partition(cfg);
    const std::vector<std::vector<Group>> rounds = groups_of(s, Grouping::Rounds);
    const std::vector<PipelineMicroBatch> mbs(
        m, {mod::Tensor::zeros({1, 8}, mod::DType::I64), mod::Tensor::zeros({1, 8}, mod::DType::I64)});
    for (int r = 0; r < pp; ++r) {
      INFO(schedule_name(kind) << " pp " << pp << " m " << m << " v " << v << ", rank " << r);
      const mod::model::Transformer model(cfg.model(), 1);
      RecordingPeers peers(r, pp);
      run_stage_step(model, s, part, peers, mbs);
      REQUIRE(peers.calls.size() == rounds[r].size());
      for (size_t g = 0; g < rounds[r].size(); ++g) {
        INFO("round " << g);
        REQUIRE(peers.calls[g].size() == rounds[r][g].size());
        for (size_t k = 0; k < rounds[r][g].size(); ++k) {
          CHECK(peers.calls[g][k].send == rounds[r][g][k].send);
          CHECK(peers.calls[g][k].peer == rounds[r][g][k].peer);
        }
      }
    }
  }
}
