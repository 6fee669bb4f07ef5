// train.profile_steps: the GPU's kernels, or the CPU's ops, over a window of steps, summed by
// name. Answers "where does a step's device time go, and how long is the device idle?" (on a
// CPU: how long the main thread is outside ops) the way torch.profiler's key_averages table
// does; the whole table goes to kernel_profile.csv.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device_trace.h"

namespace mod::train {

struct KernelRow {
  std::string name;  // short_kernel_name of the records summed here
  int64_t calls = 0;
  double total_ms = 0;
  double flop = 0;  // summed over the calls; 0 where the recorder did not know it
};

// A stretch with nothing on the device: the host was busy, or waiting, between two records.
struct IdleGap {
  double ms = 0;
  std::string after, before;  // short names of the records on either side
};

struct KernelProfile {
  std::vector<KernelRow> rows;  // by total time, largest first
  std::vector<IdleGap> gaps;    // the longest few, longest first
  int64_t steps = 0;
  double busy_ms = 0;   // the union of every record's interval: time the device did something
  double span_ms = 0;   // first start to last end
  double wall_ms = 0;   // the host's time for the steps (set by the caller)
  bool cpu_ops = false; // records are CPU ops on the main thread (core/cpu/op_trace.h), not kernels
  double sgemm_flops = 0;  // a 1024^3 SGEMM's rate timed just after the window, where known
  // Collectives (NCCL's kernels, named nccl*) against every other record: the union of each
  // set's intervals and the time both were in flight at once. A collective on the comm stream
  // that runs under backward's kernels shows as overlap; exposed = comm_ms - overlap_ms.
  double comm_ms = 0, compute_ms = 0, overlap_ms = 0;
};

// NCCL's kernels by their short names (ncclDevKernel_AllReduce_..., ncclKernel_...).
bool is_collective_kernel(const std::string& short_name);

// "void mod::cuda::(anonymous namespace)::gather_rows_copy<uint4, long>(RowMap<long>, ...)"
// -> "gather_rows_copy<uint4, long>": demangled, without return type, namespaces or parameters.
std::string short_kernel_name(const std::string& mangled);

KernelProfile summarize(const std::vector<DeviceActivity>& records, int64_t steps);

// The top rows per step, under a line of busy, idle and launch counts.
std::string format_profile(const KernelProfile& p, size_t top);
// Every row: kernel, calls, total_ms, per_step_ms, mean_us, share, gflop_per_s (empty when the
// row's FLOPs are unknown).
void write_profile_csv(const KernelProfile& p, const std::string& path);

}  // namespace mod::train
