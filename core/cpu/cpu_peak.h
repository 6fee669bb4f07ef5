// The CPU's stated f32 peak, the denominator of MFU on CPUs: cores x FLOP per cycle x clock,
// from what the processor reports, never from a timing (a short SGEMM timed at start-up on a
// busy machine underestimates the ceiling and let MFU pass 100%).
#pragma once

#include <string>

namespace mod::cpu {

struct CpuPeak {
  int cores = 1;            // this process's share: its OpenMP threads, bounded by its CPUs
  int flops_per_cycle = 8;  // f32, per core: FMA units x lanes x 2
  double ghz = 1;           // the clock: the higher of what the system reports and what is timed
  double reported_ghz = 0;  // cpufreq's maximum, else /proc/cpuinfo (a VM's TSC rate)
  std::string basis;        // how flops_per_cycle was chosen, e.g. "AVX2 + FMA, 2x256-bit FMA"
  bool overridden = false;  // MOD_CPU_PEAK_GFLOPS set the figure
  double override_flops = 0;

  double flops() const;
  // "2 cores x 32 FLOP/cycle (AVX2 + FMA, 2x256-bit FMA) x 2.45 GHz = 156.8 GFLOP/s"
  std::string describe() const;
};

// The core clock timed on a chain of dependent one-cycle integer adds (best of a few tries:
// other load only ever slows a try). A virtual machine's /proc/cpuinfo shows the TSC rate, not
// the boost clock GEMMs run at (docs/performance.md, "What MFU means here"). 0 off x86-64.
double measure_clock_ghz();

// Detected once. `local_ranks` processes on this host that do not have CPUs of their own share
// the host's cores; MOD_CPU_PEAK_GFLOPS (per process) overrides the detection.
CpuPeak cpu_peak(int local_ranks = 1);

}  // namespace mod::cpu
