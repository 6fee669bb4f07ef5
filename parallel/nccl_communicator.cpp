// The NCCL communicator (see nccl_communicator.h): a host communicator for CPU tensors and
// control, an NCCL communicator with its own stream for CUDA tensors, and one watchdog thread
// per process that ends the job when an NCCL collective hangs or fails.
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
//
// Communicators are non-blocking (config.blocking = 0): any NCCL call may return ncclInProgress
// and is done (a collective: enqueued) only once ncclCommGetAsyncError leaves ncclInProgress;
// NcclState::check waits that out under the collective timeout. A non-blocking communicator is
// also one that ncclCommAbort can stop from the watchdog while the main thread is inside a call.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "parallel/world.h"

namespace mod::parallel {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string seconds_str(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

// Polls `done()` until it returns true (then true) or `deadline` passes (then false). Yields
// the core first, where fast operations finish, then sleeps with a doubling backoff capped at
// 1 ms, as MpiCommunicator::wait does.
template <typename Done>
bool poll_until(Done&& done, Clock::time_point deadline) {
  constexpr int kYieldPolls = 200;
  constexpr int kMaxSleepUs = 1000;
  int sleep_us = 1;
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (Clock::now() > deadline) return false;
    if (polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(2 * sleep_us, kMaxSleepUs);
    }
  }
}

// cudaEventQuery / cudaStreamQuery without leaving cudaErrorNotReady behind as this thread's
// last error, where the next MOD_CUDA_CHECK_LAUNCH would report it.
cudaError_t forget_not_ready(cudaError_t rc) {
  if (rc == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
  return rc;
}
cudaError_t query(cudaEvent_t event) {
  return forget_not_ready(cudaEventQuery(event));
}
cudaError_t query(cudaStream_t stream) {
  return forget_not_ready(cudaStreamQuery(stream));
}

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

// "unhandled system error (<ncclGetLastError's detail>)".
std::string nccl_error(ncclResult_t rc, ncclComm_t comm) {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

// "ncclAllReduce" from the text of a whole call.
std::string call_name(const char* call) {
  return std::string(call, std::strcspn(call, "( "));
}

// A CUDA event without timing (the cheap kind). Destroying one still pending is allowed: CUDA
// releases it once it completes.
class Event {
 public:
  Event() { MOD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// One NCCL communicator with its stream, shared by the NcclCommunicator that owns it and the
// watchdog's records of its collectives in flight. Teardown (ncclCommFinalize + Destroy, or
// ncclCommAbort) is in the destructor, so a half-built one is cleaned up too.
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;   // recorded on the compute stream before each collective
  Communicator* host = nullptr;  // for abort(): owned by the NcclCommunicator, which outlives
                                 // every watchdog record of this state (it calls forget())
  std::string name;
  int rank = 0, size = 1;
  int world_rank = 0;      // the "modtrain: rank R:" prefix
  double timeout_s = 600;  // collective_timeout(), read once at construction
  bool clean = false;      // built completely and not torn down by an exception: finalize

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState();

  // "all_reduce on 'dp' (rank 1 of 2)", as detail::collective_where writes it.
  std::string where(const char* what) const {
    return std::string(what) + " on '" + name + "' (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ")";
  }
  // Waits out ncclInProgress (polling ncclCommGetAsyncError under the timeout; past it the job
  // ends), then throws std::runtime_error naming `call` and the collective unless rc is
  // ncclSuccess.
  void check(ncclResult_t rc, const char* call, const char* what);
};

// Checks one NCCL call made for collective `what` on NcclState `s` (see NcclState::check).
#define MOD_NCCL_CHECK(s, what, call) (s).check((call), #call, (what))

// ncclCommAbort, given at most 10 s: it can itself hang in some NCCL versions (NVIDIA/nccl#829),
// and a job that ends without it is better than one that never ends. On timeout the helper
// thread is left behind (the caller is ending the process or leaking the communicator).
void abort_bounded(ncclComm_t comm) {
  if (comm == nullptr) return;
  constexpr double kGraceSeconds = 10;
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread([comm, finished] {
    ncclCommAbort(comm);
    finished->store(true);
  }).detach();
  poll_until([&] { return finished->load(); }, deadline_after(kGraceSeconds));
}

std::atomic<bool> g_ending{false};

// Ends the job for a hung or failed NCCL collective: prints the message (first, in case
// ncclCommAbort blocks), aborts the NCCL communicator so its kernels stop, then ends every rank
// through the host communicator. The first caller does it; a second (the watchdog and the main
// thread at once) waits for the process to end.
[[noreturn]] void end_job(NcclState& s, const std::string& message) {
  if (g_ending.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  std::fflush(stdout);
  std::fprintf(stderr, "modtrain: rank %d: %s\n", s.world_rank, message.c_str());
  std::fflush(stderr);
  abort_bounded(s.comm);
  s.host->abort("NCCL communicator on '" + s.name + "' aborted after the error above", 1);
  std::_Exit(1);  // not reached: abort() ends the process (GCC cannot see through the virtual)
}

void NcclState::check(ncclResult_t rc, const char* call, const char* what) {
  if (rc == ncclInProgress && comm != nullptr) {
    const bool settled = poll_until(
        [&] {
          ncclResult_t state = ncclInProgress;
          const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
          rc = queried != ncclSuccess ? queried : state;
          return rc != ncclInProgress;
        },
        deadline_after(timeout_s));
    if (!settled)
      end_job(*this, "NCCL " + where(what) + " timed out after " + seconds_str(timeout_s) +
                         "s in " + call_name(call) +
                         ": a peer rank has probably exited or is stuck");
  }
  if (rc != ncclSuccess)
    throw std::runtime_error("NCCL: " + call_name(call) + " failed in " + where(what) + ": " +
                             nccl_error(rc, comm));
}

NcclState::~NcclState() {
  if (comm != nullptr) {
    // ncclCommFinalize flushes the communicator; non-blocking, it returns ncclInProgress until
    // done. Past the timeout, or after a failure, ncclCommAbort frees it without peers.
    ncclResult_t rc = clean ? ncclCommFinalize(comm) : ncclInternalError;
    if (rc == ncclInProgress)
      poll_until(
          [&] {
            ncclResult_t state = ncclInProgress;
            const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
            rc = queried != ncclSuccess ? queried : state;
            return rc != ncclInProgress;
          },
          deadline_after(timeout_s));
    if (rc == ncclSuccess)
      ncclCommDestroy(comm);
    else
      abort_bounded(comm);
  }
  if (ready != nullptr) cudaEventDestroy(ready);
  if (stream != nullptr) cudaStreamDestroy(stream);  // returns at once; freed once idle
}

// One collective in flight, as the watchdog sees it.
struct InFlight {
  std::shared_ptr<NcclState> state;
  std::shared_ptr<Event> done;  // recorded on the comm stream after the collective
  const char* what;             // "all_reduce"
  Clock::time_point deadline;
};

// The process's watchdog: every kPoll it checks each collective in flight and ends the job for
// one whose done-event failed, whose communicator reports an asynchronous error, or which is
// past its deadline. Finished ones are dropped. It sleeps while nothing is in flight.
class Watchdog {
 public:
  // Made, with its thread, on first use; leaked on purpose, since the detached thread may run
  // while static destructors do.
  static Watchdog& get() {
    static Watchdog* watchdog = new Watchdog(cuda::current_device());
    return *watchdog;
  }

  void watch(InFlight entry) {
    bool was_idle = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      was_idle = entries_.empty();
      entries_.push_back(std::move(entry));
    }
    if (was_idle) wake_.notify_one();
  }

  // Drops `state`'s records (the caller has drained its stream) before it is torn down; after
  // this returns the watchdog no longer touches it.
  void forget(const NcclState* state) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(entries_, [&](const InFlight& e) { return e.state.get() == state; });
  }

 private:
  explicit Watchdog(int device) : device_(device) {
    std::thread([this] { run(); }).detach();
  }

  void run() {
    constexpr auto kPoll = std::chrono::milliseconds(50);
    cudaSetDevice(device_);  // the device the events belong to (already set up on the main thread)
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (entries_.empty())
        wake_.wait(lock, [&] { return !entries_.empty(); });
      else
        wake_.wait_for(lock, kPoll);
      const Clock::time_point now = Clock::now();
      for (size_t i = 0; i < entries_.size();) {
        InFlight& e = entries_[i];
        const cudaError_t rc = query(e.done->get());
        if (rc == cudaSuccess) {
          if (i + 1 < entries_.size()) e = std::move(entries_.back());
          entries_.pop_back();
          continue;
        }
        if (rc == cudaErrorCudartUnloading) return;  // the process is exiting
        NcclState& s = *e.state;
        if (rc != cudaErrorNotReady)
          end_job(s, "NCCL " + s.where(e.what) + " failed: CUDA: " + cudaGetErrorString(rc));
        ncclResult_t async = ncclSuccess;
        const ncclResult_t queried = ncclCommGetAsyncError(s.comm, &async);
        const ncclResult_t error = queried != ncclSuccess ? queried : async;
        if (error != ncclSuccess && error != ncclInProgress)
          end_job(s, "NCCL " + s.where(e.what) + " failed: " + nccl_error(error, s.comm));
        if (now > e.deadline)
          end_job(s, "NCCL " + s.where(e.what) + " timed out after " + seconds_str(s.timeout_s) +
                         "s: a peer rank has probably exited or is stuck");
        ++i;
      }
    }
  }

  int device_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<InFlight> entries_;
};

// A collective already complete (a group of one).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// all_reduce_async over NCCL: wait() orders the compute stream after the collective; the
// tensor is held until then (or until test() has seen it finish).
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Event> done, Tensor t) : done_(std::move(done)), t_(std::move(t)) {}
  ~NcclWork() override {
    if (done_) cudaStreamWaitEvent(cuda::compute_stream(), done_->get(), 0);  // as wait(), no throw
  }
  void wait() override {
    if (!done_) return;
    MOD_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done_->get(), 0));
    release();
  }
  bool test() override {
    if (!done_) return true;
    const cudaError_t rc = query(done_->get());
    if (rc == cudaErrorNotReady) return false;
    MOD_CUDA_CHECK(rc);
    release();  // finished on the GPU: every later kernel already comes after it
    return true;
  }

 private:
  void release() {
    done_.reset();
    t_ = Tensor();
  }
  std::shared_ptr<Event> done_;  // null once waited
  Tensor t_;                     // keeps the buffer alive while NCCL writes it
};

bool overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pb = static_cast<const char*>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// detail::check_reduce_scatter without its bf16 rule (MPI cannot reduce bf16; NCCL can), with
// the same messages. Both tensors are defined here.
void check_reduce_scatter_nccl(const Communicator& comm, const Tensor& in, const Tensor& out) {
  if (in.dtype() != DType::BF16 && out.dtype() != DType::BF16) {
    detail::check_reduce_scatter(comm, in, out);
    return;
  }
  const std::string where = detail::collective_where("reduce_scatter", comm);
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
  void all_gather(const Tensor& in, const Tensor& out) override;
  void all_to_all(const Tensor& in, const Tensor& out) override;
  void broadcast(const Tensor& t, int root) override;
  void barrier() override { host_->barrier(); }  // host only: queued GPU work is not waited for
  void send(const Tensor& t, int dst, int tag) override;
  void recv(const Tensor& t, int src, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return make_nccl_communicator(host_->split(color, key, name), nccl_for_group_of_one_);
  }
  [[noreturn]] void abort(const std::string& message, int code) override {
    host_->abort(message, code);
    std::_Exit(code);  // not reached, as in end_job
  }

 private:
  // Where a collective goes: the host communicator for CPU tensors, and for undefined ones,
  // which it reports; NCCL for CUDA tensors. One CPU and one CUDA tensor is an error.
  static bool on_host(const Tensor& t) { return !t.defined() || t.device() == Device::CPU; }
  bool on_host(const char* what, const Tensor& in, const Tensor& out) const;
  // Enqueues `enqueue(state)` on the comm stream after the compute stream's work so far and
  // returns its done-event, which the watchdog now watches.
  template <typename Enqueue>
  std::shared_ptr<Event> launch(const char* what, Enqueue&& enqueue);
  // Every later kernel on the compute stream runs after `done`.
  static void wait_on(const Event& done) {
    MOD_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done.get(), 0));
  }

  std::unique_ptr<Communicator> host_;  // destroyed after nccl_ (declared first)
  bool nccl_for_group_of_one_;
  std::shared_ptr<NcclState> nccl_;  // null for a group of one
};

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
    const bool drained = poll_until([&] { return query(nccl_->stream) != cudaErrorNotReady; },
                                    deadline_after(2 * nccl_->timeout_s));
    if (!drained) nccl_->clean = false;
  }
  Watchdog::get().forget(nccl_.get());
  nccl_.reset();  // the last reference: tears the NCCL communicator down
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
  Watchdog::get().watch({nccl_, done, what, deadline_after(s.timeout_s)});
  return done;
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
  return std::make_unique<NcclWork>(std::move(done), t);
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

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     bool nccl_for_group_of_one) {
  return std::make_unique<NcclCommunicator>(std::move(host), nccl_for_group_of_one);
}

}  // namespace mod::parallel
