// The order in which a pipeline step's actions are issued: each rank's computes in its
// schedule's order, its sends and receives in numbered rounds, each round one
// Communicator::send_recv (one NCCL group).
//
// Why rounds: NCCL has no tags (between two ranks messages match in call order), a send may not
// complete until its receive is posted, and a communicator runs its operations in order on one
// stream (NCCL User Guide, "Point-to-point communication"). Issued one call at a time, 1F1B's
// steady state deadlocks (rank 0's stream: send activation, then receive gradient; rank 1's:
// send gradient, then receive activation), and grouping each run of adjacent transfers
// (Megatron's batch_isend_irecv of send_forward_recv_backward) is not enough for interleaved
// 1F1B at m > pp, where a pair of ranks exchanges in both directions over two links. Operations
// of one ncclGroupStart/End progress together ("Group Calls"), so:
//
// The rounds come from the schedule run in unit time steps with the MPI rules (non-blocking
// sends): in step t every rank runs its next compute if its inputs were sent in a step <= t;
// a compute run in step t sends its output in round t + 1, and the receiver's receive joins
// its own round t + 1 too (possibly ahead of computes that come first in its list: the buffer
// is posted early). So every message has its send and its receive in the same round on both
// ranks, and a rank sends at most one message a round. Each rank issues, for t = 0, 1, ...:
// its round t's transfers as one group, then its compute of step t. Every rank's group t is
// complete once every rank has posted its group t, which it does after its groups before t:
// by induction no rank waits forever, whatever the schedule (tests/parallel/
// pipeline_p2p_test.cpp checks it under NCCL's rules for every schedule).
#pragma once

#include <cstddef>
#include <vector>

#include "parallel/pipeline_schedule.h"

namespace mod::parallel {

// One thing a rank issues: one compute action, or one round's transfers (indices into the
// rank's actions, in schedule order).
struct IssueStep {
  bool transfers = false;
  std::vector<size_t> actions;
};

// [rank][steps in issue order] for schedule s (valid: simulate_schedule accepts it). Throws
// std::logic_error naming the rank when s cannot finish (a receive whose send never comes).
std::vector<std::vector<IssueStep>> issue_order(const PipelineSchedule& s);

}  // namespace mod::parallel
