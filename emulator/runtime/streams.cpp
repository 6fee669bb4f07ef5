// Streams and events. By default work runs late (MOD_EMU_STREAMS=late): a stream queues what is
// issued to it, and a host synchronisation (cudaStreamSynchronize, cudaDeviceSynchronize, an event
// synchronised or queried, cudaFree, a copy to pageable memory, any use of the legacy stream) runs
// every stream's queue. Among the streams whose next item may run, the item issued LAST runs
// first. CUDA promises only the order within a stream and what events impose ("Streams" and
// "Explicit Synchronization" in the CUDA C++ Programming Guide): work on two streams with no event
// between them may run in either order, so a program that forgot an event reads stale data here
// as it could on a GPU, instead of being saved by issue order. Collectives (the NCCL stand-in)
// keep their issue order among themselves, so ranks never wait on each other in different orders.
// MOD_EMU_STREAMS=at_issue runs work when it is issued instead (the order a debugger follows).
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "emu/runtime.h"
#include "state.h"

namespace emu::rt::detail {
namespace {

// The legacy default stream and each thread's per-thread default stream: never destroyed.
CUstream_st legacy_stream;
thread_local CUstream_st per_thread_stream;

}  // namespace

bool is_legacy(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy;
}

CUstream_st* resolve(cudaStream_t stream) {
  if (is_legacy(stream)) return &legacy_stream;
  if (stream == cudaStreamPerThread) return &per_thread_stream;
  return stream;
}

double now_ms() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

namespace {

emu_activity_observer g_observer = nullptr;

}  // namespace

void run_work(const char* what, const std::function<void()>& work) {
  DeviceSection section;
  if (g_observer == nullptr) {
    work();
    return;
  }
  using clock = std::chrono::steady_clock;
  const auto ns = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     clock::now().time_since_epoch())
                                     .count());
  };
  const uint64_t start = ns();
  work();
  g_observer(what, start, ns());
}

namespace {

uint64_t g_issued = 0;                 // items ever queued, over all streams
std::vector<CUstream_st*> g_busy;      // streams with a queue (some may have emptied)
std::deque<uint64_t> g_collectives;    // the queued collectives' seqs, in issue order
bool g_running = false;                // run_pending is running (a queued item cannot re-enter)
// This thread has issued work. A query from a thread that has issued none (the NCCL watchdog's
// poll) does not run the queues: on a GPU the device progresses without it, here the issuing
// threads' synchronisations move it; so it sees cudaErrorNotReady until they do. A query from
// an issuing thread runs them, so its polling loops end.
thread_local bool t_issued_work = false;

// The device's own progress. CUDA C++ Programming Guide, "Asynchronous Concurrent Execution":
// kernel launches, device-to-device copies and the like are asynchronous with respect to the
// host ("control is returned to the host thread before the device completes the requested
// task"), and a stream's work runs whether or not the host ever waits for it. The late order
// holds work back until a synchronisation; a GPU does not wait for one. A rank whose host blocks
// elsewhere (a host all-reduce over MPI, say) still runs the collectives it queued on a GPU, and
// its peers' collectives wait on them. So while a collective is queued and no work has been
// issued for kIdle, a thread of the runtime runs the queues as a synchronisation would (the
// item issued last first). Items issued before that point still race in the late order, so a
// missing event still shows; only a host that stops issuing lets the device catch up. Without a
// collective queued nothing changes: no peer can wait on the rest.
constexpr auto kIdle = std::chrono::milliseconds(100);

using Clock = std::chrono::steady_clock;
Clock::time_point g_last_issue;     // when work was last queued (under mutex())
bool g_progress_started = false;    // this process has its progress thread (under mutex())
std::atomic<bool> g_exiting{false};  // exit() has begun: the globals may be going
// Leaked on purpose: a thread may wait on it while the process exits.
std::condition_variable_any* g_progress = new std::condition_variable_any;

void progress_loop() {
  std::unique_lock lock(mutex());
  for (;;) {
    g_progress->wait(lock, [] { return g_exiting.load() || !g_collectives.empty(); });
    if (g_exiting.load()) return;
    const auto idle = Clock::now() - g_last_issue;
    if (idle < kIdle) {
      g_progress->wait_for(lock, kIdle - idle);
      continue;
    }
    run_pending();  // the host holds mutex() while it runs them, so it is not running them now
  }
}

void start_progress() {
  if (g_progress_started) return;
  g_progress_started = true;
  static const bool registered = [] {
    std::atexit([] {
      g_exiting = true;
      g_progress->notify_all();
    });
    // A forked child has no progress thread (fork copies only the calling thread) and must not
    // inherit mutex() held by it: the fork waits for mutex(), and the child, whose thread has a
    // new id and so cannot unlock the parent's hold, starts from a new mutex and its own thread.
    pthread_atfork([] { mutex().lock(); }, [] { mutex().unlock(); },
                   [] {
                     g_progress_started = false;
                     g_progress = new std::condition_variable_any;
                     new (&mutex()) std::recursive_mutex;
                   });
    return true;
  }();
  (void)registered;
  std::thread(progress_loop).detach();
}

void queue(CUstream_st* s, Pending p) {
  t_issued_work = true;
  p.seq = ++g_issued;
  g_last_issue = Clock::now();
  if (p.collective) {
    g_collectives.push_back(p.seq);
    start_progress();
    g_progress->notify_all();
  }
  if (s->pending.empty() && std::find(g_busy.begin(), g_busy.end(), s) == g_busy.end())
    g_busy.push_back(s);
  s->pending.push_back(std::move(p));
  ++s->issued;
}

Pending work_item(const char* what, std::function<void()> work, bool collective = false) {
  Pending p;
  p.what = what;
  p.work = std::move(work);
  p.collective = collective;
  return p;
}

Pending wait_item(std::shared_ptr<const uint64_t> after, uint64_t count) {
  Pending p;
  p.what = "cudaStreamWaitEvent";
  p.after = std::move(after);
  p.after_count = count;
  return p;
}

bool may_run(const Pending& p) {
  if (p.after && *p.after < p.after_count) return false;
  return !p.collective || g_collectives.front() == p.seq;
}

}  // namespace

void run_pending() {
  if (g_running) return;
  g_running = true;
  for (;;) {
    CUstream_st* next = nullptr;
    for (CUstream_st* s : g_busy)
      if (!s->pending.empty() && may_run(s->pending.front()) &&
          (next == nullptr || s->pending.front().seq > next->pending.front().seq))
        next = s;
    if (next == nullptr) break;
    Pending p = std::move(next->pending.front());
    next->pending.pop_front();
    if (p.collective) g_collectives.pop_front();
    // After a fault nothing more runs, as on a GPU whose context has failed.
    if (p.work && sticky_error() == cudaSuccess) run_work(p.what, p.work);
    ++*next->finished;
  }
  for (CUstream_st* s : g_busy)
    if (!s->pending.empty()) {  // cannot happen: a wait is issued after the record it waits for
      std::fprintf(stderr, "emulator: %s can never run (streams wait on each other)\n",
                   s->pending.front().what);
      std::abort();
    }
  g_busy.clear();
  g_running = false;
}

}  // namespace emu::rt::detail

using namespace emu::rt;
using namespace emu::rt::detail;

namespace emu::rt {

bool capturing(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  return resolve(stream)->capture != nullptr;
}

namespace {

cudaError_t issue(cudaStream_t stream, const char* what, std::function<void()> work,
                  bool collective) {
  std::lock_guard lock(mutex());
  if (sticky_error() != cudaSuccess) return sticky_error();
  CUstream_st* s = resolve(stream);
  if (s->capture) {
    if (!s->capture->violation.empty()) return record_error(cudaErrorStreamCaptureInvalidated);
    auto node = std::make_unique<CUgraphNode_st>();
    node->what = what;
    node->work = std::move(work);
    record_node(s, std::move(node));
    return cudaSuccess;
  }
  if (late_streams() && !is_legacy(stream)) {
    queue(s, work_item(what, std::move(work), collective));
    return cudaSuccess;
  }
  // The legacy stream waits for all work of every blocking stream, and they for it (CUDA Runtime
  // API, "Stream synchronization behavior"); a blocking stream being captured has none it can
  // wait for.
  if (is_legacy(stream))
    if (const cudaError_t e = legacy_use(what); e != cudaSuccess) return e;
  run_pending();
  run_work(what, work);
  return sticky_error();
}

}  // namespace

cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
  return issue(stream, what, std::move(work), false);
}

cudaError_t enqueue_collective(cudaStream_t stream, const char* what, std::function<void()> work) {
  return issue(stream, what, std::move(work), true);
}

void synchronize() {
  std::lock_guard lock(mutex());
  run_pending();
}

}  // namespace emu::rt

extern "C" {

void emu_observe_activity(emu_activity_observer observer) {
  std::lock_guard lock(mutex());
  g_observer = observer;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return record_error(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->flags = flags;
  *stream = s;
  return cudaSuccess;
}

// Priorities order the scheduling of ready blocks on a GPU; the emulator runs one item at a
// time, so a stream keeps its priority only to report it. The range is the one Hopper reports, [0, -5]
// (CUDA Runtime API, cudaDeviceGetStreamPriorityRange: lower numbers are higher priorities).
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  if (priority > 0 || priority < -5) priority = std::clamp(priority, -5, 0);  // as CUDA clamps
  const cudaError_t rc = cudaStreamCreateWithFlags(stream, flags);
  if (rc == cudaSuccess) (*stream)->priority = priority;
  return rc;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  if (priority == nullptr) return record_error(cudaErrorInvalidValue);
  *priority = is_legacy(stream) || stream == cudaStreamPerThread ? 0 : stream->priority;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (is_legacy(stream) || stream == cudaStreamPerThread)
    return record_error(cudaErrorInvalidResourceHandle);
  if (stream->capture) return capture_violation(stream, "cudaStreamDestroy");
  run_pending();  // a destroyed stream's work still completes (cudaStreamDestroy)
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (resolve(stream)->capture) return capture_violation(stream, "cudaStreamSynchronize");
  if (is_legacy(stream))
    if (const cudaError_t e = legacy_use("cudaStreamSynchronize"); e != cudaSuccess) return e;
  run_pending();
  return sticky_error();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (resolve(stream)->capture) return capture_violation(stream, "cudaStreamQuery");
  if (!resolve(stream)->pending.empty() && !t_issued_work) return record_error(cudaErrorNotReady);
  run_pending();
  return sticky_error();
}

cudaError_t cudaDeviceSynchronize() {
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaDeviceSynchronize");
  run_pending();
  return sticky_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return record_error(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->flags = flags;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(mutex());
  run_pending();  // a queued record writes into the event (CUDA releases it once completed)
  delete event;
  return cudaSuccess;
}

// In a capture an event marks the stream's position for a later cudaStreamWaitEvent, which
// makes the waiting stream join the capture (fork) or marks the recorded stream joined.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (sticky_error() != cudaSuccess) return sticky_error();
  CUstream_st* s = resolve(stream);
  event->recorded_on = s;
  if (s->capture) {
    event->captured_in = s->capture;
    event->recorded_seq = s->last_node_seq;
    return cudaSuccess;
  }
  event->captured_in = nullptr;
  if (late_streams() && !is_legacy(stream)) {
    queue(s, work_item("cudaEventRecord", [event] {
            event->recorded = true;
            event->recorded_ms = now_ms();
          }));
    event->reached_by = s->finished;
    event->reached_at = s->issued;
    return cudaSuccess;
  }
  run_pending();
  event->reached_by = nullptr;
  event->recorded = true;
  event->recorded_ms = now_ms();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (sticky_error() != cudaSuccess) return sticky_error();
  CUstream_st* s = resolve(stream);
  if (event->captured_in) {
    const auto& cap = event->captured_in;
    if (s->capture && s->capture != cap) {
      // Programming Guide, "Cross-stream Dependencies and Events": two captures cannot merge.
      capture_violation(stream, "cudaStreamWaitEvent on an event of another capture");
      return record_error(cudaErrorStreamCaptureIsolation);
    }
    if (!s->capture) {  // fork: the stream joins the capture
      if (is_legacy(stream))
        return capture_violation(stream, "the legacy stream joining a capture");
      s->capture = cap;
      s->last_node_seq = 0;
      s->joined_seq = 0;
      cap->streams.push_back(s);
    }
    // The recording stream's work up to the event is joined into this one's.
    CUstream_st* from = event->recorded_on;
    if (from != s && event->recorded_seq > from->joined_seq) from->joined_seq = event->recorded_seq;
    return cudaSuccess;
  }
  // An event recorded outside any capture. A late stream waits for it in its queue; a capture
  // or the legacy stream cannot (the legacy stream runs at issue), so what it waits for runs now.
  if (event->reached_by && *event->reached_by < event->reached_at) {
    if (s->capture || is_legacy(stream))
      run_pending();
    else
      queue(s, wait_item(event->reached_by, event->reached_at));
  }
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (event->captured_in) return record_error(cudaErrorCapturedEvent);
  run_pending();
  return sticky_error();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (event->captured_in) return record_error(cudaErrorCapturedEvent);
  if (event->reached_by && *event->reached_by < event->reached_at && !t_issued_work)
    return record_error(cudaErrorNotReady);
  run_pending();
  return sticky_error();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard lock(mutex());
  if (ms == nullptr || start == nullptr || end == nullptr)
    return record_error(cudaErrorInvalidValue);
  if (start->captured_in || end->captured_in) return record_error(cudaErrorCapturedEvent);
  run_pending();
  if (!start->recorded || !end->recorded) return record_error(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return record_error(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>(end->recorded_ms - start->recorded_ms);
  return cudaSuccess;
}

}  // extern "C"
