// The runtime's objects behind CUDA's opaque handles (CUstream_st, CUevent_st, CUgraph_st,
// CUgraphExec_st, CUgraphNode_st: the toolkit headers only declare them) and the process state
// every API call shares. One recursive mutex guards all of it: work runs synchronously under it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace emu::rt::detail {

struct Capture;
struct GraphImpl;

// Work issued to a stream and not yet run (streams run late: streams.cpp). A wait runs once
// another stream has finished `after_count` items; a collective once every collective issued
// before it has run.
struct Pending {
  uint64_t seq = 0;  // issue order across all streams
  const char* what = "";
  std::function<void()> work;                  // empty for a wait
  std::shared_ptr<const uint64_t> after;       // a wait: the other stream's finished count
  uint64_t after_count = 0;
  bool collective = false;
};

}  // namespace emu::rt::detail

struct CUgraph_st {
  std::shared_ptr<emu::rt::detail::GraphImpl> impl;
};

// A node of a graph: work (a kernel, copy, memset, library call or a launched child graph) or
// a conditional IF node with its body.
struct CUgraphNode_st {
  std::string what;
  std::function<void()> work;                        // empty for a conditional node
  cudaGraphConditionalHandle handle = 0;             // conditional nodes only
  std::shared_ptr<emu::rt::detail::GraphImpl> body;  // conditional nodes only
  cudaGraph_t body_handle = nullptr;                 // what phGraph_out[0] points at
  ~CUgraphNode_st() { delete body_handle; }
};

struct CUgraphExec_st {
  std::shared_ptr<emu::rt::detail::GraphImpl> impl;
};

struct CUstream_st {
  unsigned flags = 0;
  int priority = 0;
  std::shared_ptr<emu::rt::detail::Capture> capture;  // set while captured
  uint64_t last_node_seq = 0;  // the capture sequence number of its latest node
  uint64_t joined_seq = 0;     // the latest of its events another captured stream waited on
  std::deque<emu::rt::detail::Pending> pending;  // issued, not yet run (late streams)
  uint64_t issued = 0;                           // items ever queued
  std::shared_ptr<uint64_t> finished = std::make_shared<uint64_t>(0);  // items run
};

struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  double recorded_ms = 0;  // host time when the record ran (in its stream's order)
  std::shared_ptr<emu::rt::detail::Capture> captured_in;  // recorded during a capture
  CUstream_st* recorded_on = nullptr;
  uint64_t recorded_seq = 0;
  // Outside a capture, on a late stream: reached once that stream has finished `reached_at`
  // items (its record is the last of them).
  std::shared_ptr<const uint64_t> reached_by;
  uint64_t reached_at = 0;
};

namespace emu::rt::detail {

// Nodes in issue order. Work issued to a stream runs after everything issued before it that it
// depends on; issue order is one such order for every stream of a capture, so a graph replays
// its nodes in the order they were captured.
struct GraphImpl {
  std::vector<std::unique_ptr<CUgraphNode_st>> nodes;
  std::vector<cudaGraphConditionalHandle> handles;  // created for this graph
};

// One capture sequence: the graph it fills, its mode, the thread that began it, and the first
// prohibited call that invalidated it.
struct Capture {
  std::shared_ptr<GraphImpl> graph;
  cudaGraph_t graph_handle = nullptr;  // cudaStreamGetCaptureInfo's graph_out
  bool owns_graph_handle = false;      // begun by cudaStreamBeginCapture, not ...ToGraph
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  CUstream_st* origin = nullptr;
  std::vector<CUstream_st*> streams;  // every stream that joined it
  unsigned long long id = 0;
  std::string violation;  // empty while valid
  uint64_t seq = 0;       // nodes captured so far
  CUgraphNode_st* last_node = nullptr;
};

std::recursive_mutex& mutex();

// The sticky error, else cudaSuccess; and the last error cudaGetLastError returns and clears.
cudaError_t sticky_error();
cudaError_t record_error(cudaError_t code);  // sets the last error, returns code

// The stream a handle names: nullptr and cudaStreamLegacy name the legacy default stream,
// cudaStreamPerThread this thread's default stream.
CUstream_st* resolve(cudaStream_t stream);
bool is_legacy(cudaStream_t stream);

// Whether this thread may make a "potentially unsafe" call now (cudaMalloc, synchronising):
// not while a capture begun in global or thread-local mode on this thread is active, nor while
// another thread's global-mode capture is, when this thread's mode is global (CUDA Runtime API,
// cudaThreadExchangeStreamCaptureMode).
bool unsafe_call_prohibited();
// Invalidates every capture that prohibits this thread's unsafe call, naming it.
cudaError_t unsafe_call(const std::string& what);

// A use of the legacy stream: an error (cudaErrorStreamCaptureImplicit) that invalidates
// every capture of a blocking stream, which the legacy stream would have to wait for.
cudaError_t legacy_use(const char* what);

// Appends work to the capture `stream` is in.
void record_node(CUstream_st* stream, std::unique_ptr<CUgraphNode_st> node);

// Whether issued work waits for the next synchronisation (MOD_EMU_STREAMS=late, the default)
// rather than running at issue (MOD_EMU_STREAMS=at_issue): options.cpp.
bool late_streams();
// Runs every stream's pending work, latest issued first wherever events and stream order allow
// (streams.cpp): what a host synchronisation waits for.
void run_pending();

// Runs one item of device work (a kernel, copy, memset, library call or collective) under a
// DeviceSection, and tells the activity observer (the CUPTI stand-in) its name and its start and
// end in host nanoseconds. `what` is the name the item was issued with.
void run_work(const char* what, const std::function<void()>& work);

// Runs a graph's nodes in order (conditional bodies where their handle is nonzero).
void run_graph(const GraphImpl& graph);

double now_ms();

// Device work running: device memory is accessible to the host thread only inside (memory.cpp).
void enter_device();
void leave_device();
struct DeviceSection {
  DeviceSection() { enter_device(); }
  ~DeviceSection() { leave_device(); }
  DeviceSection(const DeviceSection&) = delete;
  DeviceSection& operator=(const DeviceSection&) = delete;
};

}  // namespace emu::rt::detail
