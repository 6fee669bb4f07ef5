// The communicator every parallel code path talks to: collectives and point-to-point on
// contiguous CPU tensors over one group of ranks. Backends: a local stand-in for a group of one
// (every collective is a copy or a no-op, so each parallel path runs on a CPU-only machine),
// Open MPI for CPU tensors, and NCCL for CUDA tensors (parallel/nccl_communicator.h).
//
// Invariants:
// - Every rank of the group calls the same collectives in the same order with the same shapes
//   and dtypes; a mismatch that can be seen locally is an error naming the collective.
// - A collective never hangs silently: one that does not finish within collective_timeout()
//   aborts every rank with a message naming the collective, the group and the rank.
// - Results are bitwise identical on every rank of the group (TP ranks rely on it to route the
//   same tokens).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mod::parallel {

enum class ReduceOp { Sum, Max, Min };
const char* reduce_op_name(ReduceOp op);

// One send or receive of Communicator::send_recv.
struct PeerTransfer {
  enum Kind { Send, Recv } kind;
  Tensor tensor;
  int peer = -1;
  int tag = 0;  // matched by MPI; NCCL has no tags (checked >= 0, else ignored)
};

// A started non-blocking collective; wait() returns once its result is in place (or aborts the
// job on timeout). Destroying an unwaited Work waits for it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // Lets the collective progress without blocking (MPI moves non-blocking collectives only
  // inside MPI calls); true once it is complete. The default knows nothing: false.
  virtual bool test() { return false; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's role in messages: "world", "dp", "tp".
  virtual const std::string& name() const = 0;

  // t <- op over the group's t, in place. Same shape and dtype on every rank.
  virtual void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  virtual std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // in [size * n, ...] -> out [n, ...]: out = op over ranks of in's chunk number rank().
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::Sum) = 0;
  // reduce_scatter started without blocking: out holds the result once the Work is waited;
  // neither tensor may be touched until then (ZeRO-1's gradient buckets, data_parallel.h).
  virtual std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                     ReduceOp op = ReduceOp::Sum) = 0;
  // in [n, ...] -> out [size * n, ...]: chunk r of out is rank r's in.
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  // all_gather started without blocking: out holds the result once the Work is waited; neither
  // tensor may be touched until then (ZeRO-3 gathers the next unit while one computes, zero3.h).
  // MPI and NCCL start it and return; this default runs all_gather at once and returns a done
  // Work (the rendezvous, local and test communicators, whose collectives finish when called).
  virtual std::unique_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out);
  // in, out [size * n, ...]: chunk j of in goes to rank j; chunk j of out came from rank j.
  virtual void all_to_all(const Tensor& in, const Tensor& out) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  virtual void send(const Tensor& t, int dst, int tag = 0) = 0;
  virtual void recv(const Tensor& t, int src, int tag = 0) = 0;
  // send started without blocking; t stays untouched until the Work is waited (pipeline
  // stages send while their neighbour sends back). Only the MPI backend has it; others throw.
  virtual std::unique_ptr<Work> send_async(const Tensor& t, int dst, int tag = 0);
  // Sends and receives started together (Megatron's batch_isend_irecv): NCCL runs them as one
  // ncclGroupStart/End, so a rank's send to a peer and its receive from that peer (or another)
  // progress together and cannot wait on each other. NCCL has no tags: between two ranks
  // messages match in call order (see pipeline_issue_order.h). On return the received tensors
  // are in place for later work, as after recv; the sent tensors stay untouched until the
  // returned Work is waited. This default (MPI) starts the sends with send_async, then
  // receives in order.
  virtual std::unique_ptr<Work> send_recv(const std::vector<PeerTransfer>& transfers);

  // A sub-group of the ranks that pass the same color, ordered by key (MPI_Comm_split).
  // Collective over this group.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Prints "modtrain: rank R: message" to stderr and ends every rank of the job with `code`.
  [[noreturn]] virtual void abort(const std::string& message, int code = 1) = 0;

  // Puts the device work enqueued so far under this communicator's timeout, as a whole
  // (`what` names it in the error). A replayed CUDA graph calls it: its collectives were
  // captured, not launched, so none was watched. Communicators that block on the host: nothing.
  virtual void watch_enqueued(const char* what) { (void)what; }
};

// A group of one: collectives copy or do nothing; send/recv are errors.
std::unique_ptr<Communicator> make_local_communicator(const std::string& name = "world");

// Seconds a blocking collective (or Work::wait) may take before it aborts the job:
// MOD_COLLECTIVE_TIMEOUT_S, default 600.
double collective_timeout();

// A positive, finite number of seconds from environment variable var, or default_seconds when it
// is unset; anything else is an error naming the variable and its value.
double seconds_from_env(const char* var, double default_seconds);

// Checks every backend makes before it communicates. Each throws std::invalid_argument whose
// message starts with collective_where() and names the tensors.
namespace detail {
// "all_gather on 'dp' (rank 1 of 2)".
std::string collective_where(const char* collective, const Communicator& comm);
// t is defined; a reduction also needs a dtype MPI can reduce (not bf16).
void check_tensor(const char* collective, const Communicator& comm, const Tensor& t,
                  bool reduction);
// in [size * n, ...] -> out [n, ...]; same dtype and device; disjoint buffers. `what` names
// the call in messages.
void check_reduce_scatter(const Communicator& comm, const Tensor& in, const Tensor& out,
                          const char* what = "reduce_scatter");
// in [n, ...] -> out [size * n, ...]; same dtype and device; disjoint buffers.
void check_all_gather(const Communicator& comm, const Tensor& in, const Tensor& out);
// in, out [size * n, ...]; same dtype and device; disjoint buffers.
void check_all_to_all(const Communicator& comm, const Tensor& in, const Tensor& out);
// 0 <= peer < size; `self_ok` false also rejects peer == rank() (send/recv to oneself).
void check_peer(const char* what, const Communicator& comm, int peer, bool self_ok);
}  // namespace detail

}  // namespace mod::parallel
