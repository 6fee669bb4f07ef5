// train.profile_steps on a CPU: the wall time of every CPU backend op on the thread that started
// the trace, as the same records a GPU trace gives (core/device_trace.h), so one summary serves
// both. Every CPU op passes through dispatch_float, which opens a scope; a scope inside another
// (an op calling an op) is not recorded, so records never overlap and their union is the time
// the step spent in ops. Off, a scope costs one thread-local load.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "core/device_trace.h"

namespace mod::cpu {

// Start recording this thread's CPU ops. Throws std::logic_error when a trace already runs.
void start_op_trace();
// Stop and return what was recorded since start_op_trace() (empty when none ran). Call it
// between ops, as start_op_trace.
std::vector<DeviceActivity> stop_op_trace();

namespace detail {
struct OpTrace {
  std::vector<DeviceActivity> records;
  std::chrono::steady_clock::time_point origin;
  int depth = 0;
};
inline thread_local OpTrace* t_op_trace = nullptr;
}  // namespace detail

class OpTraceScope {
 public:
  explicit OpTraceScope(const char* name, double flop = 0) {
    if (detail::t_op_trace) open(name, flop);
  }
  // The label is built only while a trace runs (e.g. a GEMM's shape).
  template <typename Label>
    requires std::invocable<Label&>
  OpTraceScope(Label&& label, double flop) {
    if (detail::t_op_trace) open(label(), flop);
  }
  ~OpTraceScope() {
    if (trace_) close();
  }
  OpTraceScope(const OpTraceScope&) = delete;
  OpTraceScope& operator=(const OpTraceScope&) = delete;

 private:
  void open(const char* name, double flop);  // out of line: callers stay small
  void open(std::string&& name, double flop);
  void close();

  detail::OpTrace* trace_ = nullptr;  // set while this thread traces
  size_t index_ = 0;
  bool outer_ = false;  // the outermost op: this scope holds a record
};

}  // namespace mod::cpu
