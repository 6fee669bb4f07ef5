// The Open MPI backend of Communicator, for contiguous CPU tensors. Built only with
// MOD_USE_MPI=ON (MOD_HAVE_MPI); nothing outside parallel/ includes this header.
//
// Invariants:
// - Every blocking call is the non-blocking MPI call plus a polling wait that yields the core
//   and aborts the job after collective_timeout() seconds, naming the collective and group.
// - Errors come back as codes (MPI_ERRORS_RETURN) and abort the job with the MPI call's name.
// - Shapes, dtypes and devices are checked locally before any MPI call (std::invalid_argument).
// - A wait that finds a group peer's process gone (mpi_peer_watch.h) aborts naming that peer.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace mod::parallel {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (MPI_Comm_free in the destructor unless MPI is finalized).
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(const Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> all_reduce_async(const Tensor& t, ReduceOp op) override;
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const Tensor& in, const Tensor& out,
                                             ReduceOp op) override;
  void all_gather(const Tensor& in, const Tensor& out) override;
  std::unique_ptr<Work> all_gather_async(const Tensor& in, const Tensor& out) override;
  void all_to_all(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  void barrier() override;
  void send(const Tensor& t, int dst, int tag) override;
  void recv(const Tensor& t, int src, int tag) override;
  std::unique_ptr<Work> send_async(const Tensor& t, int dst, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;
  [[noreturn]] void abort(const std::string& message, int code = 1) override;

  MPI_Comm handle() const { return comm_; }

  // Polls `request` until it completes (filling `status` if given); aborts the job after the
  // timeout. `what` names the operation in the message ("all_reduce").
  void wait(MPI_Request& request, const char* what, MPI_Status* status = nullptr);
  // Aborts the job when rc is an MPI error: "<call> on 'dp' (rank 1 of 2): <MPI error string>".
  void check(int rc, const char* call);

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  int world_rank_ = 0;              // for the "modtrain: rank R:" prefix of abort messages
  std::vector<int> world_ranks_;    // the group's members as world ranks, by group rank
  std::string group_ranks() const;  // "world ranks [0,1] on vm/10.0.0.1, vm/10.0.0.2"
  double timeout_s_;                // collective_timeout(), read once at construction
};

}  // namespace mod::parallel
