// The NCCL backend of Communicator, for CUDA tensors. Built only with MOD_USE_CUDA
// (MOD_HAVE_NCCL); callers include this header and never nccl.h.
//
// The communicator wraps a host communicator (MPI, or the local one) of the same group:
// collectives on CUDA tensors go to NCCL, on CPU tensors to the host communicator, so control
// traffic, barrier() and every CPU path keep working unchanged. A collective given one CPU and
// one CUDA tensor is an error naming the collective.
//
// Invariants:
// - Stream order, no host blocking: a collective runs on the communicator's own stream after
//   everything queued so far on cuda::compute_stream(); a blocking call makes the compute stream
//   wait for it, so its result is in place for every later kernel and copy (host copies
//   synchronise the compute stream). Work::wait() does the same for all_reduce_async.
// - Never a silent hang: a watchdog thread aborts the job (message naming the collective, the
//   group and the rank) when a collective is not done after collective_timeout() seconds or
//   NCCL reports an asynchronous error.
// - CUDA-graph capture: a collective enqueued while the compute stream captures joins the graph
//   (the comm stream forks from and joins the compute stream through events) and is not handed
//   to the watchdog, whose queries of an event that a capture only records would fail; after
//   each replay the trainer calls watch_enqueued, which watches the replay as a whole.
// - A group of one makes no NCCL communicator: collectives copy or do nothing, as the local
//   communicator does (bf16 reductions included, as over NCCL).
// - Bitwise equal results on every rank: NCCL reduces each element once and copies the result.
// - send/recv: NCCL has no tags. Messages between two ranks match in call order and must have
//   the same element count on both sides (NCCL cannot check it; a mismatch corrupts or hangs
//   until the timeout); tags are checked (>= 0) and otherwise ignored. send_recv groups its
//   sends and receives (ncclGroupStart/End), so they progress together.
// See docs/parallel.md, "NCCL backend". The pieces: nccl_state.h (error state), nccl_work.h
// (events, Work), nccl_watchdog.h (the watchdog thread).
#pragma once

#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace mod::parallel {

namespace nccl {
struct NcclState;
class Event;
}  // namespace nccl

// Wraps `host` (any communicator: its group becomes the NCCL group) and, when the group has
// more than one rank, builds an NCCL communicator on cuda::current_device(): rank 0 makes the
// unique id and the host communicator broadcasts it. Collective over the group. split() splits
// the host communicator and wraps the result the same way.
// `nccl_for_group_of_one` (tests): build a one-rank NCCL communicator for a group of one too,
// so a machine with one GPU runs the NCCL code path; split() passes it on.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     bool nccl_for_group_of_one = false);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, bool nccl_for_group_of_one);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }

  void all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                             ReduceOp op) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  void all_to_all(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  void barrier() override { host_->barrier(); }  // host only: queued GPU work is not waited for
  void send(const Tensor& t, int dst, int tag) override;
  void recv(const Tensor& t, int src, int tag) override;
  // One ncclGroupStart/End of every send and receive; the compute stream then waits for it.
  std::unique_ptr<Work> send_recv(const std::vector<PeerTransfer>& transfers) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(const std::string& message, int code) override;
  void watch_enqueued(const char* what) override;

 private:
  // Where a collective goes: the host communicator for CPU tensors, and for undefined ones,
  // which it reports; NCCL for CUDA tensors. One CPU and one CUDA tensor is an error.
  static bool on_host(const Tensor& t) { return !t.defined() || t.device() == Device::CPU; }
  bool on_host(const char* what, const Tensor& in, const Tensor& out) const;
  // Enqueues `enqueue(state)` on the comm stream after the compute stream's work so far and
  // returns its done-event, which the watchdog now watches (unless the stream is capturing).
  template <typename Enqueue>
  std::shared_ptr<nccl::Event> launch(const char* what, Enqueue&& enqueue);
  static bool capturing();  // the compute stream is being captured into a CUDA graph
  // Every later kernel on the compute stream runs after `done`.
  static void wait_on(const nccl::Event& done);

  std::unique_ptr<Communicator> host_;  // destroyed after nccl_ (declared first)
  bool nccl_for_group_of_one_;
  std::shared_ptr<nccl::NcclState> nccl_;  // null for a group of one
};

}  // namespace mod::parallel
