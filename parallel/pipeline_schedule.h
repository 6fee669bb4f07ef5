// Pipeline schedules with no model: for each of pp ranks, the ordered list of actions it runs in
// one training step of m micro-batches (docs/parallel.md "Pipeline parallelism").
//
// Invariants (checked by simulate_schedule, tested for pp 2..8 and m 1..16):
// - Rank r holds v model chunks (v = virtual_stages, 1 unless interleaved); chunk c of rank r
//   is virtual stage c * pp + r, so activations go r -> r + 1 and from rank pp - 1 back to
//   rank 0 between chunks, as Megatron lays out interleaved stages.
// - Every micro-batch runs forward then backward once per chunk; a compute action that needs a
//   peer's tensor is directly preceded by its receive, and one whose output a peer needs is
//   directly followed by its send.
// - Sends do not block (MPI_Isend, buffer kept until the step ends); receives block. Every
//   channel (sender, receiver, activation or gradient) carries its tensors in the order the
//   receiver expects them (the runtime also tags each link between virtual stages apart).
// - Each chunk runs its backwards in micro-batch order 0, 1, ..., m - 1, so gradients
//   accumulate in the order of one process's gradient accumulation.
#pragma once

#include <string>
#include <vector>

namespace mod::parallel {

enum class PipelineScheduleKind { GPipe, OneFOneB, Interleaved1F1B };
const char* schedule_name(PipelineScheduleKind kind);  // "gpipe", "1f1b", "interleaved-1f1b"

enum class PipeOp { Forward, Backward, SendActivation, RecvActivation, SendGrad, RecvGrad };
const char* pipe_op_name(PipeOp op);

struct PipeAction {
  PipeOp op;
  int microbatch = 0;  // 0..m-1
  int chunk = 0;       // this rank's model chunk, 0..v-1
  int peer = -1;       // the other rank of a send or receive; -1 for compute
};

struct PipelineSchedule {
  PipelineScheduleKind kind;
  int pp = 1, microbatches = 1, virtual_stages = 1;
  std::vector<std::vector<PipeAction>> ranks;  // [pp][actions in order]
  int virtual_stage(int rank, int chunk) const { return chunk * pp + rank; }
};

// pp >= 1 ranks, m >= 1 micro-batches; v >= 1 chunks per rank (only Interleaved1F1B takes
// v > 1, and it needs v >= 2 and m a multiple of pp). Bad arguments throw
// std::invalid_argument naming them.
PipelineSchedule make_schedule(PipelineScheduleKind kind, int pp, int microbatches,
                               int virtual_stages = 1);

// Times of one compute action, indexed [rank][chunk]. A send does not block its rank; the
// tensor reaches the receiver `transfer` later (0: sends and receives take no time).
struct StageCosts {
  std::vector<std::vector<double>> forward, backward;
  double transfer = 0;
  static StageCosts uniform(int pp, int v, double forward, double backward);
};

struct ScheduleSimulation {
  double makespan = 0;               // the step: the last action's end
  std::vector<double> busy;          // [rank] compute time
  std::vector<double> finish;        // [rank] when its last action ends
  std::vector<int> max_in_flight;    // [rank] most micro-batch chunks forwarded, not yet backward
  double bubble_fraction() const;    // idle / (pp x makespan)
};

// Runs every rank's list as the runtime would (blocking receives, non-blocking sends) and
// checks the invariants above; a violation or a deadlock throws std::logic_error naming the
// rank, action and micro-batch.
ScheduleSimulation simulate_schedule(const PipelineSchedule& s, const StageCosts& costs);

// The bubble of pp equal stages with zero-time transfers: (pp - 1) / (v x m + pp - 1);
// v = 1 for GPipe and 1F1B (Narayanan et al. 2021, section 2.2).
double predicted_bubble(int pp, int microbatches, int virtual_stages = 1);

}  // namespace mod::parallel
