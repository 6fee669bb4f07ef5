// The CPU op trace (op_trace.h).
#include "core/cpu/op_trace.h"

#include <stdexcept>

namespace mod::cpu {

namespace {
uint64_t since(const detail::OpTrace& t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - t.origin)
                                   .count());
}
}  // namespace

void start_op_trace() {
  if (detail::t_op_trace) throw std::logic_error("start_op_trace: a trace is already running");
  detail::t_op_trace = new detail::OpTrace{{}, std::chrono::steady_clock::now(), 0};
}

std::vector<DeviceActivity> stop_op_trace() {
  detail::OpTrace* t = detail::t_op_trace;
  if (!t) return {};
  detail::t_op_trace = nullptr;
  std::vector<DeviceActivity> out = std::move(t->records);
  delete t;
  return out;
}

void OpTraceScope::open(const char* name, double flop) { open(std::string(name), flop); }

void OpTraceScope::open(std::string&& name, double flop) {
  detail::OpTrace& t = *detail::t_op_trace;
  trace_ = &t;
  if (t.depth++ > 0) return;  // inside another op: that op's record covers this time
  outer_ = true;
  index_ = t.records.size();
  DeviceActivity& r = t.records.emplace_back();
  r.name = std::move(name);
  r.flop = flop;
  r.start_ns = since(t);
}

void OpTraceScope::close() {
  --trace_->depth;
  if (outer_) trace_->records[index_].end_ns = since(*trace_);
}

}  // namespace mod::cpu
