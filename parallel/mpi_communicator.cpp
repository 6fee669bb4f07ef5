// The Open MPI communicator: each blocking collective is the non-blocking MPI call plus a
// polling wait with a deadline, so a dead or stuck peer aborts the job instead of hanging it.
// Invariant: no MPI call is made before the local checks pass, and every MPI return code is
// checked (MPI_ERRORS_RETURN is set on every communicator this file creates).
#include "parallel/mpi_communicator.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <vector>

#include "parallel/mpi_peer_watch.h"

namespace mod::parallel {

namespace {

// Tensors must be host memory MPI can read; counts must fit MPI's int.
void check_host(const char* what, const Communicator& comm, const Tensor& t, int64_t count) {
  const std::string where = detail::collective_where(what, comm);
  if (t.device() != Device::CPU)
    throw std::invalid_argument(where + ": " + dtype_name(t.dtype()) + shape_str(t.shape()) +
                                " is on " + device_name(t.device()) +
                                ": the MPI backend moves host memory only; CUDA tensors go "
                                "through NCCL (make_nccl_communicator)");
  if (count > INT_MAX)
    throw std::invalid_argument(where + ": " + describe(t) + " needs " + std::to_string(count) +
                                " elements per message, more than MPI's int count");
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::I32:
      return MPI_INT32_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::BF16:
      return MPI_UINT16_T;  // moved as raw bits, never reduced
  }
  throw std::logic_error("mpi_type: unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  throw std::logic_error("mpi_op: unknown op");
}

int count_of(const Tensor& t) {
  return static_cast<int>(t.numel());
}

// A non-blocking collective `what` in flight; holds its tensors (in and out) until complete.
class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator& comm, MPI_Request request, const char* what, Tensor t, Tensor t2 = {})
      : comm_(comm), request_(request), what_(what), t_(std::move(t)), t2_(std::move(t2)) {}
  ~MpiWork() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) wait();
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) comm_.wait(request_, what_);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    if (MPI_Test(&request_, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) wait();  // wait() reports it
    return done != 0;
  }

 private:
  MpiCommunicator& comm_;
  MPI_Request request_;  // MPI_REQUEST_NULL once complete
  const char* what_;
  Tensor t_, t2_;        // keep the buffers alive while MPI reads and writes them
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name)
    : comm_(comm), name_(std::move(name)), timeout_s_(collective_timeout()) {
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank");
  MPI_Group group, world_group;
  check(MPI_Comm_group(comm_, &group), "MPI_Comm_group");
  check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group");
  std::vector<int> ranks(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) ranks[r] = r;
  world_ranks_.resize(ranks.size());
  check(MPI_Group_translate_ranks(group, size_, ranks.data(), world_group, world_ranks_.data()),
        "MPI_Group_translate_ranks");
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
}

std::string MpiCommunicator::group_ranks() const {
  constexpr size_t kListed = 8;  // a message, not a dump: larger groups list their first 8
  std::string ranks, hosts;
  for (size_t i = 0; i < world_ranks_.size() && i < kListed; ++i) {
    ranks += (i ? "," : "") + std::to_string(world_ranks_[i]);
    hosts += (i ? ", " : "") + peer_host(world_ranks_[i]);
  }
  if (world_ranks_.size() > kListed) {
    const std::string more = ",... (" + std::to_string(world_ranks_.size()) + " ranks)";
    ranks += more;
    hosts += ", ...";
  }
  return "world ranks [" + ranks + "] on " + hosts;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS)
    length = std::snprintf(text, sizeof text, "MPI error code %d", rc);
  abort(detail::collective_where(call, *this) + ": " + std::string(text, length));
}

void MpiCommunicator::wait(MPI_Request& request, const char* what, MPI_Status* status) {
  // Spin with sched_yield first (fast collectives finish here), then sleep with a doubling
  // backoff capped at 1 ms: ranks may share cores, and MPI progresses only inside MPI_Test.
  constexpr int kYieldPolls = 200;
  constexpr int kMaxSleepUs = 1000;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s_));
  // After a short grace, look for a peer whose process is gone (every 20 ms): Open MPI would
  // leave this request pending until the launcher kills the job, saying nothing here, and the
  // launcher kills the survivors about a second after the loss, so the check must come early.
  constexpr auto kPeerCheckAfter = std::chrono::milliseconds(20);
  const auto start = Clock::now();
  auto next_peer_check = start + kPeerCheckAfter;
  int sleep_us = 1;
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(&request, &done, status != nullptr ? status : MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) check(rc, ("MPI_Test for " + std::string(what)).c_str());
    if (done) return;
    if (polls < kYieldPolls) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(2 * sleep_us, kMaxSleepUs);
    }
    const auto now = Clock::now();
    if (now > next_peer_check) {
      next_peer_check = now + std::chrono::milliseconds(20);
      const int lost = find_lost_peer(world_ranks_);
      if (lost >= 0)
        abort("lost peer rank " + std::to_string(lost) + " (host " + peer_host(lost) + ") during " +
              detail::collective_where(what, *this) + ", group of " + group_ranks() +
              ": its process exited or was killed");
    }
    if (now > deadline) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%g", timeout_s_);
      abort(detail::collective_where(what, *this) + " did not complete in " + seconds +
            " s: a peer rank has probably exited or is stuck, or the network is down (group " +
            "of " + group_ranks() + ")");
    }
  }
}

void MpiCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  detail::check_tensor("all_reduce", *this, t, true);
  check_host("all_reduce", *this, t, t.numel());
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), count_of(t), mpi_type(t.dtype()), mpi_op(op),
                       comm_, &request),
        "MPI_Iallreduce");
  wait(request, "all_reduce");
}

std::unique_ptr<Work> MpiCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  detail::check_tensor("all_reduce_async", *this, t, true);
  check_host("all_reduce_async", *this, t, t.numel());
  MPI_Request request;
  check(MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), count_of(t), mpi_type(t.dtype()), mpi_op(op),
                       comm_, &request),
        "MPI_Iallreduce");
  return std::make_unique<MpiWork>(*this, request, "all_reduce_async", t);
}

void MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  detail::check_reduce_scatter(*this, in, out);
  check_host("reduce_scatter", *this, in, out.numel());
  check_host("reduce_scatter", *this, out, out.numel());
  MPI_Request request;
  check(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), count_of(out),
                                  mpi_type(in.dtype()), mpi_op(op), comm_, &request),
        "MPI_Ireduce_scatter_block");
  wait(request, "reduce_scatter");
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                            ReduceOp op) {
  const char* what = "reduce_scatter_async";
  detail::check_reduce_scatter(*this, in, out, what);
  check_host(what, *this, in, out.numel());
  check_host(what, *this, out, out.numel());
  MPI_Request request;
  check(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), count_of(out),
                                  mpi_type(in.dtype()), mpi_op(op), comm_, &request),
        "MPI_Ireduce_scatter_block");
  return std::make_unique<MpiWork>(*this, request, what, in, out);
}

void MpiCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  detail::check_all_gather(*this, in, out);
  check_host("all_gather", *this, in, in.numel());
  check_host("all_gather", *this, out, in.numel());
  const MPI_Datatype type = mpi_type(in.dtype());
  MPI_Request request;
  check(MPI_Iallgather(in.raw_data(), count_of(in), type, out.raw_data(), count_of(in), type, comm_,
                       &request),
        "MPI_Iallgather");
  wait(request, "all_gather");
}

std::unique_ptr<Work> MpiCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  const char* what = "all_gather_async";
  detail::check_all_gather(*this, in, out);
  check_host(what, *this, in, in.numel());
  check_host(what, *this, out, in.numel());
  const MPI_Datatype type = mpi_type(in.dtype());
  MPI_Request request;
  check(MPI_Iallgather(in.raw_data(), count_of(in), type, out.raw_data(), count_of(in), type, comm_,
                       &request),
        "MPI_Iallgather");
  return std::make_unique<MpiWork>(*this, request, what, in, out);
}

void MpiCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  detail::check_all_to_all(*this, in, out);
  const int64_t chunk = in.numel() / size_;
  check_host("all_to_all", *this, in, chunk);
  check_host("all_to_all", *this, out, chunk);
  const MPI_Datatype type = mpi_type(in.dtype());
  MPI_Request request;
  check(MPI_Ialltoall(in.raw_data(), static_cast<int>(chunk), type, out.raw_data(),
                      static_cast<int>(chunk), type, comm_, &request),
        "MPI_Ialltoall");
  wait(request, "all_to_all");
}

void MpiCommunicator::broadcast(const Tensor& t, int root) {
  detail::check_tensor("broadcast", *this, t, false);
  detail::check_peer("broadcast", *this, root, true);
  check_host("broadcast", *this, t, t.numel());
  MPI_Request request;
  check(MPI_Ibcast(t.raw_data(), count_of(t), mpi_type(t.dtype()), root, comm_, &request),
        "MPI_Ibcast");
  wait(request, "broadcast");
}

void MpiCommunicator::barrier() {
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
  wait(request, "barrier");
}

void MpiCommunicator::send(const Tensor& t, int dst, int tag) {
  send_async(t, dst, tag)->wait();
}

std::unique_ptr<Work> MpiCommunicator::send_async(const Tensor& t, int dst, int tag) {
  detail::check_tensor("send", *this, t, false);
  detail::check_peer("send", *this, dst, false);
  check_host("send", *this, t, t.numel());
  if (tag < 0)
    throw std::invalid_argument(detail::collective_where("send", *this) + ": negative tag " +
                                std::to_string(tag));
  MPI_Request request;
  check(MPI_Isend(t.raw_data(), count_of(t), mpi_type(t.dtype()), dst, tag, comm_, &request),
        "MPI_Isend");
  return std::make_unique<MpiWork>(*this, request, "send", t);
}

void MpiCommunicator::recv(const Tensor& t, int src, int tag) {
  detail::check_tensor("recv", *this, t, false);
  detail::check_peer("recv", *this, src, false);
  check_host("recv", *this, t, t.numel());
  if (tag < 0)
    throw std::invalid_argument(detail::collective_where("recv", *this) + ": negative tag " +
                                std::to_string(tag));
  MPI_Request request;
  check(MPI_Irecv(t.raw_data(), count_of(t), mpi_type(t.dtype()), src, tag, comm_, &request),
        "MPI_Irecv");
  MPI_Status status;
  wait(request, "recv", &status);
  // A longer message fails in MPI_Test (truncation); a shorter one is caught here.
  int received = 0;
  check(MPI_Get_count(&status, mpi_type(t.dtype()), &received), "MPI_Get_count");
  if (received != count_of(t))
    abort(detail::collective_where("recv", *this) + ": got " + std::to_string(received) +
          " elements from rank " + std::to_string(src) + " for " + describe(t));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  if (color < 0)
    throw std::invalid_argument(detail::collective_where("split", *this) + " into '" + name +
                                "': negative color " + std::to_string(color));
  // MPI_Comm_split blocks with no deadline; exchange (color, key) first under our timeout so a
  // missing peer aborts here, and use the table to check the group MPI builds.
  std::vector<int> mine = {color, key}, all(2 * static_cast<size_t>(size_));
  MPI_Request request;
  check(MPI_Iallgather(mine.data(), 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &request),
        "MPI_Iallgather");
  wait(request, "split");
  int expect_size = 0, expect_rank = 0;
  for (int r = 0; r < size_; ++r) {
    if (all[2 * r] != color) continue;
    ++expect_size;
    const int other_key = all[2 * r + 1];
    if (other_key < key || (other_key == key && r < rank_)) ++expect_rank;
  }
  MPI_Comm sub = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  auto result = std::make_unique<MpiCommunicator>(sub, name);
  if (result->size() != expect_size || result->rank() != expect_rank)
    abort(detail::collective_where("split", *this) + " into '" + name + "': MPI gave rank " +
          std::to_string(result->rank()) + " of " + std::to_string(result->size()) + ", expected " +
          std::to_string(expect_rank) + " of " + std::to_string(expect_size));
  return result;
}

void MpiCommunicator::abort(const std::string& message, int code) {
  std::fflush(stdout);
  std::fprintf(stderr, "modtrain: rank %d: %s\n", world_rank_, message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace mod::parallel
