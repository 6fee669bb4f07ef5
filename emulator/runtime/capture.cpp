// Stream capture (Programming Guide, "CUDA Graphs", "Creating a Graph Using Stream Capture";
// CUDA Runtime API, cudaStreamBeginCapture and cudaThreadExchangeStreamCaptureMode): work
// issued to a captured stream, or to a stream that waited on one of its events, becomes a node
// of the capture's graph instead of running. What the Guide prohibits during a capture
// ("Prohibited and Unhandled Operations": synchronising or querying a captured stream or
// event, the legacy stream's implicit synchronisation, a "potentially unsafe" call such as
// cudaMalloc outside relaxed mode) fails and invalidates the capture, whose
// cudaStreamEndCapture then fails too.
#include <atomic>
#include <string>

#include "emu/runtime.h"
#include "state.h"

namespace emu::rt::detail {
namespace {

std::vector<std::shared_ptr<Capture>>& active() {
  static std::vector<std::shared_ptr<Capture>> captures;
  return captures;
}

// This thread's mode (cudaThreadExchangeStreamCaptureMode); global unless changed.
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
unsigned long long next_id = 1;

void invalidate(Capture& c, const std::string& what) {
  if (c.violation.empty()) c.violation = what;
}

void leave(Capture& c) {
  for (CUstream_st* s : c.streams) s->capture = nullptr;
  auto& all = active();
  for (auto it = all.begin(); it != all.end(); ++it)
    if (it->get() == &c) {
      all.erase(it);
      break;
    }
}

std::shared_ptr<Capture> begin(CUstream_st* s, std::shared_ptr<GraphImpl> graph,
                               cudaStreamCaptureMode mode) {
  auto c = std::make_shared<Capture>();
  c->graph = std::move(graph);
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->streams.push_back(s);
  c->id = next_id++;
  s->capture = c;
  s->last_node_seq = 0;
  s->joined_seq = 0;
  active().push_back(c);
  return c;
}

}  // namespace

bool unsafe_call_prohibited() {
  if (thread_mode == cudaStreamCaptureModeRelaxed) return false;
  for (const auto& c : active()) {
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->thread == std::this_thread::get_id()) return true;
    if (c->mode == cudaStreamCaptureModeGlobal && thread_mode == cudaStreamCaptureModeGlobal)
      return true;
  }
  return false;
}

cudaError_t unsafe_call(const std::string& what) {
  for (const auto& c : active()) {
    if (c->mode == cudaStreamCaptureModeRelaxed) continue;
    if (c->thread == std::this_thread::get_id() || c->mode == cudaStreamCaptureModeGlobal)
      invalidate(*c, what + " (a potentially unsafe call) while capturing");
  }
  return record_error(cudaErrorStreamCaptureUnsupported);
}

cudaError_t legacy_use(const char* what) {
  bool any = false;
  for (const auto& c : active())
    for (CUstream_st* s : c->streams)
      if (!(s->flags & cudaStreamNonBlocking)) {
        invalidate(*c, std::string(what) +
                           " on the legacy stream while a blocking stream is "
                           "captured");
        any = true;
      }
  return any ? record_error(cudaErrorStreamCaptureImplicit) : cudaSuccess;
}

void record_node(CUstream_st* s, std::unique_ptr<CUgraphNode_st> node) {
  Capture& c = *s->capture;
  c.last_node = node.get();
  c.graph->nodes.push_back(std::move(node));
  s->last_node_seq = ++c.seq;
}

}  // namespace emu::rt::detail

using namespace emu::rt;
using namespace emu::rt::detail;

namespace emu::rt {

cudaError_t capture_violation(cudaStream_t stream, const std::string& what) {
  std::lock_guard lock(mutex());
  CUstream_st* s = resolve(stream);
  if (s->capture) invalidate(*s->capture, what + " while the stream was captured");
  return record_error(cudaErrorStreamCaptureUnsupported);
}

}  // namespace emu::rt

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  std::lock_guard lock(mutex());
  if (is_legacy(stream)) return record_error(cudaErrorStreamCaptureUnsupported);
  CUstream_st* s = resolve(stream);
  if (s->capture) return record_error(cudaErrorIllegalState);
  auto graph = std::make_shared<GraphImpl>();
  auto c = begin(s, graph, mode);
  c->graph_handle = new CUgraph_st{graph};
  c->owns_graph_handle = true;
  return sticky_error();
}

cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
                                          const cudaGraphNode_t* /*dependencies*/,
                                          const cudaGraphEdgeData* /*edge_data*/,
                                          size_t /*num_dependencies*/, cudaStreamCaptureMode mode) {
  std::lock_guard lock(mutex());
  if (is_legacy(stream) || graph == nullptr) return record_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s->capture) return record_error(cudaErrorIllegalState);
  auto c = begin(s, graph->impl, mode);
  c->graph_handle = graph;
  return sticky_error();
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  std::lock_guard lock(mutex());
  if (graph == nullptr) return record_error(cudaErrorInvalidValue);
  *graph = nullptr;
  CUstream_st* s = resolve(stream);
  if (!s->capture) return record_error(cudaErrorIllegalState);
  const std::shared_ptr<Capture> c = s->capture;
  if (c->origin != s) {
    invalidate(*c, "cudaStreamEndCapture on a stream that did not begin the capture");
    return record_error(cudaErrorStreamCaptureUnmatched);
  }
  if (c->mode == cudaStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id())
    return record_error(cudaErrorStreamCaptureWrongThread);
  cudaError_t result = cudaSuccess;
  if (!c->violation.empty()) {
    result = cudaErrorStreamCaptureInvalidated;
  } else {
    // Every stream that joined must have been joined back into the origin: its last node
    // precedes an event the capture waited on (Programming Guide, "Cross-stream Dependencies
    // and Events").
    for (CUstream_st* other : c->streams)
      if (other != s && other->last_node_seq > other->joined_seq) {
        c->violation = "a stream forked into the capture was not joined back";
        result = cudaErrorStreamCaptureUnjoined;
      }
  }
  leave(*c);
  if (result != cudaSuccess) {
    std::fprintf(stderr, "emulator: stream capture failed: %s\n", c->violation.c_str());
    if (c->owns_graph_handle) delete c->graph_handle;
    return record_error(result);
  }
  *graph = c->graph_handle;
  return sticky_error();
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  std::lock_guard lock(mutex());
  const CUstream_st* s = resolve(stream);
  *status = !s->capture                     ? cudaStreamCaptureStatusNone
            : s->capture->violation.empty() ? cudaStreamCaptureStatusActive
                                            : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

// The dependencies a captured stream's next node would have: here its capture's latest node.
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** dependencies,
                                     const cudaGraphEdgeData** edge_data,
                                     size_t* num_dependencies) {
  std::lock_guard lock(mutex());
  if (status == nullptr) return record_error(cudaErrorInvalidValue);
  cudaStreamIsCapturing(stream, status);
  const CUstream_st* s = resolve(stream);
  static thread_local cudaGraphNode_t deps[1];
  if (id) *id = s->capture ? s->capture->id : 0;
  if (graph) *graph = s->capture ? s->capture->graph_handle : nullptr;
  if (edge_data) *edge_data = nullptr;
  const bool has = s->capture && s->capture->last_node;
  if (has) deps[0] = s->capture->last_node;
  if (dependencies) *dependencies = has ? deps : nullptr;
  if (num_dependencies) *num_dependencies = has ? 1 : 0;
  return sticky_error();
}

// Nodes are kept in issue order, so setting a stream's dependencies to a node added by hand
// (a conditional node) needs nothing more: work issued next comes after it.
cudaError_t cudaStreamUpdateCaptureDependencies(cudaStream_t stream, cudaGraphNode_t* nodes,
                                                const cudaGraphEdgeData* /*edge_data*/,
                                                size_t count, unsigned int /*flags*/) {
  std::lock_guard lock(mutex());
  CUstream_st* s = resolve(stream);
  if (!s->capture) return record_error(cudaErrorIllegalState);
  for (size_t i = 0; i < count; ++i) s->capture->last_node = nodes[i];
  return sticky_error();
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return record_error(cudaErrorInvalidValue);
  std::swap(thread_mode, *mode);
  return cudaSuccess;
}

}  // extern "C"
