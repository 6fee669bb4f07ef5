// Streams and events. Work runs when it is issued (emulator/include/emu/runtime.h says why that is
// a schedule CUDA allows), so a stream is always idle when the host looks: synchronising returns at
// once, after checking that it is allowed. Events record the host time at which they were reached.
#include <algorithm>
#include <chrono>
#include <string>

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

}  // namespace emu::rt::detail

using namespace emu::rt;
using namespace emu::rt::detail;

namespace emu::rt {

bool capturing(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  return resolve(stream)->capture != nullptr;
}

cudaError_t enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
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
  // The legacy stream waits for all work of every blocking stream (CUDA Runtime API, "Stream
  // synchronization behavior"); a blocking stream being captured has none it can wait for.
  if (is_legacy(stream))
    if (const cudaError_t e = legacy_use(what); e != cudaSuccess) return e;
  {
    DeviceSection section;
    work();
  }
  return sticky_error();
}

}  // namespace emu::rt

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return record_error(cudaErrorInvalidValue);
  auto* s = new CUstream_st;
  s->flags = flags;
  *stream = s;
  return cudaSuccess;
}

// Priorities order the scheduling of ready blocks on a GPU; work here runs at issue, so a
// stream keeps its priority only to report it. The range is the one Hopper reports, [0, -5]
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
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (resolve(stream)->capture) return capture_violation(stream, "cudaStreamSynchronize");
  if (is_legacy(stream))
    if (const cudaError_t e = legacy_use("cudaStreamSynchronize"); e != cudaSuccess) return e;
  return sticky_error();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (resolve(stream)->capture) return capture_violation(stream, "cudaStreamQuery");
  return sticky_error();
}

cudaError_t cudaDeviceSynchronize() {
  std::lock_guard lock(mutex());
  if (unsafe_call_prohibited()) return unsafe_call("cudaDeviceSynchronize");
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
  // An event recorded outside any capture: work already ran, nothing to wait for.
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (event->captured_in) return record_error(cudaErrorCapturedEvent);
  return sticky_error();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  std::lock_guard lock(mutex());
  if (event == nullptr) return record_error(cudaErrorInvalidResourceHandle);
  if (event->captured_in) return record_error(cudaErrorCapturedEvent);
  return sticky_error();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  std::lock_guard lock(mutex());
  if (ms == nullptr || start == nullptr || end == nullptr)
    return record_error(cudaErrorInvalidValue);
  if (start->captured_in || end->captured_in) return record_error(cudaErrorCapturedEvent);
  if (!start->recorded || !end->recorded) return record_error(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return record_error(cudaErrorInvalidResourceHandle);
  *ms = static_cast<float>(end->recorded_ms - start->recorded_ms);
  return cudaSuccess;
}

}  // extern "C"
