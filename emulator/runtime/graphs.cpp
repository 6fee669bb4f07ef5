// Graphs: instantiated from a capture and launched on a stream, replaying their nodes on the
// memory they were captured with. Conditional IF nodes (CUDA Runtime API,
// cudaGraphConditionalHandleCreate; Programming Guide, "Conditional Graph Nodes"): a handle
// whose value a kernel sets with cudaGraphSetConditional, reset to its default at each launch
// when created with cudaGraphCondAssignDefault, and a body graph that runs when it is nonzero.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "emu/runtime.h"
#include "state.h"

namespace emu::rt::detail {
namespace {

struct Handle {
  unsigned value = 0;
  unsigned default_value = 0;
  bool assign_default = false;
};

std::vector<Handle>& handles() {
  static std::vector<Handle> h(1);  // handle 0 is never issued
  return h;
}

void reset_handles(const GraphImpl& g) {
  for (cudaGraphConditionalHandle h : g.handles) {
    Handle& handle = handles()[h];
    if (handle.assign_default) handle.value = handle.default_value;
  }
  for (const auto& node : g.nodes)
    if (node->body) reset_handles(*node->body);
}

void run_nodes(const GraphImpl& g) {
  for (const auto& node : g.nodes) {
    if (sticky_error() != cudaSuccess) return;
    if (node->body) {
      if (handles()[node->handle].value != 0) run_nodes(*node->body);
    } else {
      run_work(node->what.c_str(), node->work);
    }
  }
}

}  // namespace

void run_graph(const GraphImpl& g) {
  reset_handles(g);
  run_nodes(g);
}

}  // namespace emu::rt::detail

using namespace emu::rt;
using namespace emu::rt::detail;

// A device-side call (cuda_device_runtime_api.h declares it for nvcc only): the handle's value
// for the rest of this launch of its graph.
void cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value) {
  std::lock_guard lock(mutex());
  if (handle == 0 || handle >= handles().size()) {
    fail_sticky(cudaErrorInvalidValue,
                "cudaGraphSetConditional: handle " + std::to_string(handle) + " was never made");
    return;
  }
  handles()[handle].value = value;
}

extern "C" {

cudaError_t cudaGraphCreate(cudaGraph_t* graph, unsigned int /*flags*/) {
  if (graph == nullptr) return record_error(cudaErrorInvalidValue);
  *graph = new CUgraph_st{std::make_shared<GraphImpl>()};
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return record_error(cudaErrorInvalidValue);
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long /*flags*/) {
  std::lock_guard lock(mutex());
  if (exec == nullptr || graph == nullptr) return record_error(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->impl};
  return sticky_error();
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return record_error(cudaErrorInvalidValue);
  delete exec;
  return cudaSuccess;
}

// Launched into a captured stream, the graph becomes one node of that capture.
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  std::lock_guard lock(mutex());
  if (exec == nullptr) return record_error(cudaErrorInvalidValue);
  std::shared_ptr<GraphImpl> g = exec->impl;
  return enqueue(stream, "cudaGraphLaunch", [g] { run_graph(*g); });
}

cudaError_t cudaGraphConditionalHandleCreate(cudaGraphConditionalHandle* handle, cudaGraph_t graph,
                                             unsigned int default_value, unsigned int flags) {
  std::lock_guard lock(mutex());
  if (handle == nullptr || graph == nullptr) return record_error(cudaErrorInvalidValue);
  if (const char* refuse = std::getenv("MOD_EMU_NO_CONDITIONAL_NODES"); refuse && *refuse == '1')
    return record_error(cudaErrorNotSupported);  // a driver older than the toolkit, for tests
  handles().push_back({default_value, default_value, (flags & cudaGraphCondAssignDefault) != 0});
  *handle = handles().size() - 1;
  graph->impl->handles.push_back(*handle);
  return sticky_error();
}

// Only conditional IF nodes with one body are added by hand; everything else is captured.
cudaError_t cudaGraphAddNode(cudaGraphNode_t* node, cudaGraph_t graph,
                             const cudaGraphNode_t* /*dependencies*/,
                             const cudaGraphEdgeData* /*edge_data*/, size_t /*num_dependencies*/,
                             cudaGraphNodeParams* params) {
  std::lock_guard lock(mutex());
  if (node == nullptr || graph == nullptr || params == nullptr)
    return record_error(cudaErrorInvalidValue);
  if (params->type != cudaGraphNodeTypeConditional ||
      params->conditional.type != cudaGraphCondTypeIf || params->conditional.size != 1)
    return record_error(cudaErrorNotSupported);
  const cudaGraphConditionalHandle h = params->conditional.handle;
  if (h == 0 || h >= handles().size()) return record_error(cudaErrorInvalidValue);
  auto n = std::make_unique<CUgraphNode_st>();
  n->what = "conditional IF node";
  n->handle = h;
  n->body = std::make_shared<GraphImpl>();
  n->body_handle = new CUgraph_st{n->body};  // lives as long as the node (as CUDA's does)
  params->conditional.phGraph_out = &n->body_handle;
  *node = n.get();
  graph->impl->nodes.push_back(std::move(n));
  return sticky_error();
}

}  // extern "C"
