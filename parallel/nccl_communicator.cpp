// The NCCL communicator (see nccl_communicator.h): a host communicator for CPU tensors and
// control, an NCCL communicator with its own stream for CUDA tensors (nccl_state.h), and the
// process's watchdog (nccl_watchdog.h), which ends the job when a collective hangs or fails.
//
// Each collective: record `ready` on the compute stream, make the comm stream wait on it,
// enqueue the NCCL call(s) on the comm stream, record a fresh `done` event there and hand it to
// the watchdog. A blocking call then makes the compute stream wait on `done`; all_reduce_async
// returns a Work whose wait() does. The caching allocator reuses freed blocks in compute-stream
// order, so a tensor may be dropped once the compute stream waits on `done`; until then the
// Work holds it.
//
// all_to_all is ncclGroupStart, ncclSend/ncclRecv with every other rank, ncclGroupEnd, and a
// device copy for the rank's own chunk. NCCL 2.28 (the headers this was built against) also
// has ncclAlltoAll, which does the same; the grouped form works from NCCL 2.7 on, so one path
// serves every version.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "parallel/nccl_state.h"
#include "parallel/nccl_watchdog.h"
#include "parallel/nccl_work.h"
#include "parallel/world.h"

namespace mod::parallel {

using nccl::deadline_after;
using nccl::DoneWork;
using nccl::Event;
using nccl::NcclState;
using nccl::NcclWork;
using nccl::Watchdog;

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::I32:
      return ncclInt32;
    case DType::I64:
      return ncclInt64;
    case DType::BF16:
      return ncclBfloat16;
  }
  throw std::logic_error("nccl_type: unknown dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  throw std::logic_error("nccl_op: unknown op");
}

size_t count_of(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// detail::check_reduce_scatter without its bf16 rule (MPI cannot reduce bf16; NCCL can), with
// the same messages. Both tensors are defined here.
void check_reduce_scatter_nccl(const Communicator& comm, const Tensor& in, const Tensor& out,
                               const char* what = "reduce_scatter") {
  if (in.dtype() != DType::BF16 && out.dtype() != DType::BF16) {
    detail::check_reduce_scatter(comm, in, out, what);
    return;
  }
  const std::string where = detail::collective_where(what, comm);
  const std::string both = "in " + describe(in) + ", out " + describe(out);
  const std::string size = std::to_string(comm.size());
  if (in.dim() >= 1 && in.size(0) % comm.size() != 0)
    throw std::invalid_argument(where + ": in " + describe(in) +
                                " has a first dimension not divisible by size " + size);
  if (in.dtype() != out.dtype() || in.device() != out.device())
    throw std::invalid_argument(where + ": in and out differ in dtype or device: " + both);
  if (in.dim() < 1) throw std::invalid_argument(where + ": needs at least one dimension: " + both);
  Shape expect = in.shape();
  expect[0] /= comm.size();
  if (out.shape() != expect)
    throw std::invalid_argument(where + ": " + both + "; expected out " + shape_str(expect) +
                                " (in [size * n, ...] -> out [n, ...], size " + size + ")");
  if (overlap(in, out)) throw std::invalid_argument(where + ": in and out share memory: " + both);
}

void check_tag(const char* what, const Communicator& comm, int tag) {
  if (tag < 0)
    throw std::invalid_argument(detail::collective_where(what, comm) + ": negative tag " +
                                std::to_string(tag));
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host, bool nccl_for_group_of_one)
    : host_(std::move(host)), nccl_for_group_of_one_(nccl_for_group_of_one) {
  if (!host_) throw std::invalid_argument("make_nccl_communicator: no host communicator");
  if (size() == 1 && !nccl_for_group_of_one_) return;
  auto s = std::make_shared<NcclState>();
  s->host = host_.get();
  s->name = name();
  s->rank = rank();
  s->size = size();
  s->world_rank = launch_info().rank;
  s->timeout_s = collective_timeout();
  MOD_CUDA_CHECK(cudaSetDevice(cuda::current_device()));

  // Rank 0's unique id reaches every rank over the host communicator, as a CPU tensor.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank() == 0) MOD_NCCL_CHECK(*s, "init", ncclGetUniqueId(&id));
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  Tensor id_bytes = Tensor::empty({static_cast<int64_t>(sizeof id / sizeof(int32_t))}, DType::I32);
  std::memcpy(id_bytes.raw_data(), &id, sizeof id);
  host_->broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.raw_data(), sizeof id);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  MOD_NCCL_CHECK(*s, "init", ncclCommInitRankConfig(&s->comm, size(), id, rank(), &config));

  // The comm stream gets the highest priority, so NCCL's few blocks are scheduled as soon as
  // they are ready instead of queueing behind backward's kernels.
  int least = 0, greatest = 0;
  MOD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  MOD_CUDA_CHECK(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, greatest));
  MOD_CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
  Watchdog::get();  // its thread is running before the first collective
  s->clean = true;
  nccl_ = std::move(s);
}

NcclCommunicator::~NcclCommunicator() {
  if (!nccl_) return;
  if (std::uncaught_exceptions() > 0) {
    nccl_->clean = false;  // peers may be out of step: abort rather than finalize with them
  } else {
    // Queued collectives finish first. Each has a watchdog record, so one that hangs ends the
    // job at its deadline; the bound here only guards against a stream stuck on other work.
    const bool drained =
        nccl::poll_until([&] { return nccl::query(nccl_->stream) != cudaErrorNotReady; },
                         deadline_after(2 * nccl_->timeout_s));
    if (!drained) nccl_->clean = false;
  }
  Watchdog::get().forget(nccl_.get());
  nccl_.reset();  // the last reference: tears the NCCL communicator down
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  return make_nccl_communicator(host_->split(color, key, name), nccl_for_group_of_one_);
}

void NcclCommunicator::abort(const std::string& message, int code) {
  host_->abort(message, code);
  std::_Exit(code);  // not reached, as in end_job
}

bool NcclCommunicator::capturing() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  MOD_CUDA_CHECK(cudaStreamIsCapturing(cuda::compute_stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

void NcclCommunicator::wait_on(const Event& done) {
  MOD_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done.get(), 0));
}

bool NcclCommunicator::on_host(const char* what, const Tensor& in, const Tensor& out) const {
  if (!in.defined() || !out.defined()) return true;
  if (in.device() != out.device())
    throw std::invalid_argument(detail::collective_where(what, *this) + ": in " + describe(in) +
                                ", out " + describe(out) +
                                ": one CPU and one CUDA tensor (CPU tensors go to the host "
                                "communicator, CUDA tensors to NCCL)");
  return in.device() == Device::CPU;
}

template <typename Enqueue>
std::shared_ptr<Event> NcclCommunicator::launch(const char* what, Enqueue&& enqueue) {
  NcclState& s = *nccl_;
  auto done = std::make_shared<Event>();
  MOD_CUDA_CHECK(cudaEventRecord(s.ready, cuda::compute_stream()));
  MOD_CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.ready, 0));
  enqueue(s);
  MOD_CUDA_CHECK(cudaEventRecord(done->get(), s.stream));
  if (!capturing()) Watchdog::get().watch({nccl_, done, what, deadline_after(s.timeout_s)});
  return done;
}

void NcclCommunicator::watch_enqueued(const char* what) {
  if (!nccl_) return;
  auto done = std::make_shared<Event>();
  MOD_CUDA_CHECK(cudaEventRecord(done->get(), cuda::compute_stream()));
  Watchdog::get().watch({nccl_, done, what, deadline_after(nccl_->timeout_s)});
}

void NcclCommunicator::all_reduce(const Tensor& t, ReduceOp op) {
  if (on_host(t)) return host_->all_reduce(t, op);
  if (!nccl_ || t.numel() == 0) return;
  wait_on(*launch("all_reduce", [&](NcclState& s) {
    MOD_NCCL_CHECK(s, "all_reduce",
                   ncclAllReduce(t.raw_data(), t.raw_data(), count_of(t), nccl_type(t.dtype()),
                                 nccl_op(op), s.comm, s.stream));
  }));
}

std::unique_ptr<Work> NcclCommunicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  if (on_host(t)) return host_->all_reduce_async(t, op);
  if (!nccl_ || t.numel() == 0) return std::make_unique<DoneWork>();
  auto done = launch("all_reduce_async", [&](NcclState& s) {
    MOD_NCCL_CHECK(s, "all_reduce_async",
                   ncclAllReduce(t.raw_data(), t.raw_data(), count_of(t), nccl_type(t.dtype()),
                                 nccl_op(op), s.comm, s.stream));
  });
  return std::make_unique<NcclWork>(std::move(done), capturing(), t);
}

void NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  if (on_host("reduce_scatter", in, out)) return host_->reduce_scatter(in, out, op);
  check_reduce_scatter_nccl(*this, in, out);
  if (!nccl_) return Tensor(out).copy_from(in);
  if (out.numel() == 0) return;
  wait_on(*launch("reduce_scatter", [&](NcclState& s) {
    MOD_NCCL_CHECK(s, "reduce_scatter",
                   ncclReduceScatter(in.raw_data(), out.raw_data(), count_of(out),
                                     nccl_type(in.dtype()), nccl_op(op), s.comm, s.stream));
  }));
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter_async(const Tensor& in, const Tensor& out,
                                                             ReduceOp op) {
  const char* what = "reduce_scatter_async";
  if (on_host(what, in, out)) return host_->reduce_scatter_async(in, out, op);
  check_reduce_scatter_nccl(*this, in, out, what);
  if (!nccl_) {
    Tensor(out).copy_from(in);
    return std::make_unique<DoneWork>();
  }
  if (out.numel() == 0) return std::make_unique<DoneWork>();
  auto done = launch(what, [&](NcclState& s) {
    MOD_NCCL_CHECK(s, what,
                   ncclReduceScatter(in.raw_data(), out.raw_data(), count_of(out),
                                     nccl_type(in.dtype()), nccl_op(op), s.comm, s.stream));
  });
  return std::make_unique<NcclWork>(std::move(done), capturing(), in, out);
}

void NcclCommunicator::all_gather(const Tensor& in, const Tensor& out) {
  if (on_host("all_gather", in, out)) return host_->all_gather(in, out);
  detail::check_all_gather(*this, in, out);
  if (!nccl_) return Tensor(out).copy_from(in);
  if (in.numel() == 0) return;
  wait_on(*launch("all_gather", [&](NcclState& s) {
    MOD_NCCL_CHECK(s, "all_gather",
                   ncclAllGather(in.raw_data(), out.raw_data(), count_of(in), nccl_type(in.dtype()),
                                 s.comm, s.stream));
  }));
}

std::unique_ptr<Work> NcclCommunicator::all_gather_async(const Tensor& in, const Tensor& out) {
  const char* what = "all_gather_async";
  if (on_host(what, in, out)) return host_->all_gather_async(in, out);
  detail::check_all_gather(*this, in, out);
  if (!nccl_) {
    Tensor(out).copy_from(in);
    return std::make_unique<DoneWork>();
  }
  if (in.numel() == 0) return std::make_unique<DoneWork>();
  auto done = launch(what, [&](NcclState& s) {
    MOD_NCCL_CHECK(s, what,
                   ncclAllGather(in.raw_data(), out.raw_data(), count_of(in), nccl_type(in.dtype()),
                                 s.comm, s.stream));
  });
  return std::make_unique<NcclWork>(std::move(done), capturing(), in, out);
}

void NcclCommunicator::all_to_all(const Tensor& in, const Tensor& out) {
  if (on_host("all_to_all", in, out)) return host_->all_to_all(in, out);
  detail::check_all_to_all(*this, in, out);
  if (!nccl_) return Tensor(out).copy_from(in);
  if (in.numel() == 0) return;
  wait_on(*launch("all_to_all", [&](NcclState& s) {
    const size_t chunk = count_of(in) / static_cast<size_t>(s.size);
    const size_t bytes = chunk * dtype_size(in.dtype());
    const ncclDataType_t type = nccl_type(in.dtype());
    const char* src = static_cast<const char*>(in.raw_data());
    char* dst = static_cast<char*>(out.raw_data());
    const size_t own = static_cast<size_t>(s.rank) * bytes;
    MOD_CUDA_CHECK(
        cudaMemcpyAsync(dst + own, src + own, bytes, cudaMemcpyDeviceToDevice, s.stream));
    if (s.size == 1) return;
    // Inside a group the calls only queue; errors come back from ncclGroupEnd, which is always
    // reached so the group is never left open.
    MOD_NCCL_CHECK(s, "all_to_all", ncclGroupStart());
    ncclResult_t queued = ncclSuccess;
    auto keep_first_error = [&](ncclResult_t rc) {
      if (queued == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) queued = rc;
    };
    for (int j = 0; j < s.size; ++j) {
      if (j == s.rank) continue;
      const size_t at = static_cast<size_t>(j) * bytes;
      keep_first_error(ncclSend(src + at, chunk, type, j, s.comm, s.stream));
      keep_first_error(ncclRecv(dst + at, chunk, type, j, s.comm, s.stream));
    }
    MOD_NCCL_CHECK(s, "all_to_all", ncclGroupEnd());
    s.check(queued, "ncclSend/ncclRecv", "all_to_all");
  }));
}

void NcclCommunicator::broadcast(const Tensor& t, int root) {
  if (on_host(t)) return host_->broadcast(t, root);
  detail::check_peer("broadcast", *this, root, true);
  if (!nccl_ || t.numel() == 0) return;
  wait_on(*launch("broadcast", [&](NcclState& s) {
    MOD_NCCL_CHECK(s, "broadcast",
                   ncclBroadcast(t.raw_data(), t.raw_data(), count_of(t), nccl_type(t.dtype()),
                                 root, s.comm, s.stream));
  }));
}

void NcclCommunicator::send(const Tensor& t, int dst, int tag) {
  if (on_host(t)) return host_->send(t, dst, tag);
  detail::check_peer("send", *this, dst, false);  // a group of one ends here
  check_tag("send", *this, tag);
  if (t.numel() == 0) return;
  wait_on(*launch("send", [&](NcclState& s) {
    MOD_NCCL_CHECK(
        s, "send",
        ncclSend(t.raw_data(), count_of(t), nccl_type(t.dtype()), dst, s.comm, s.stream));
  }));
}

void NcclCommunicator::recv(const Tensor& t, int src, int tag) {
  if (on_host(t)) return host_->recv(t, src, tag);
  detail::check_peer("recv", *this, src, false);
  check_tag("recv", *this, tag);
  if (t.numel() == 0) return;
  wait_on(*launch("recv", [&](NcclState& s) {
    MOD_NCCL_CHECK(
        s, "recv",
        ncclRecv(t.raw_data(), count_of(t), nccl_type(t.dtype()), src, s.comm, s.stream));
  }));
}

// One group, as all_to_all's: NCCL User Guide, "Group Calls" (ncclGroupStart/End around
// point-to-point calls "to fuse multiple calls into one" and avoid the deadlock of ranks that
// each send before they receive) and "Point-to-point communication" (a send may block until
// its receive is posted; between two ranks messages match in call order).
std::unique_ptr<Work> NcclCommunicator::send_recv(const std::vector<PeerTransfer>& transfers) {
  const char* what = "send_recv";
  bool host = true, cuda = true;
  for (const PeerTransfer& t : transfers) {
    (on_host(t.tensor) ? cuda : host) = false;
    detail::check_peer(what, *this, t.peer, false);  // a group of one ends here
    check_tag(what, *this, t.tag);
  }
  if (transfers.empty()) return std::make_unique<DoneWork>();
  if (host) return host_->send_recv(transfers);
  if (!cuda)
    throw std::invalid_argument(detail::collective_where(what, *this) +
                                ": CPU and CUDA tensors in one batch (CPU tensors go to the host "
                                "communicator, CUDA tensors to NCCL)");
  wait_on(*launch(what, [&](NcclState& s) {
    MOD_NCCL_CHECK(s, what, ncclGroupStart());
    ncclResult_t queued = ncclSuccess;
    for (const PeerTransfer& t : transfers) {
      if (t.tensor.numel() == 0) continue;
      const ncclDataType_t type = nccl_type(t.tensor.dtype());
      const ncclResult_t rc =
          t.kind == PeerTransfer::Send
              ? ncclSend(t.tensor.raw_data(), count_of(t.tensor), type, t.peer, s.comm, s.stream)
              : ncclRecv(t.tensor.raw_data(), count_of(t.tensor), type, t.peer, s.comm, s.stream);
      if (queued == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) queued = rc;
    }
    MOD_NCCL_CHECK(s, what, ncclGroupEnd());  // always reached: the group is never left open
    s.check(queued, "ncclSend/ncclRecv", what);
  }));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     bool nccl_for_group_of_one) {
  return std::make_unique<NcclCommunicator>(std::move(host), nccl_for_group_of_one);
}

}  // namespace mod::parallel
