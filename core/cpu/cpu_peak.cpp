// The CPU's stated f32 peak (see cpu_peak.h).
#include "core/cpu/cpu_peak.h"

#include "core/cpu/threads.h"

#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

namespace mod::cpu {

namespace {

// The x86 family as the vendors number it (base + extended family).
int cpu_family() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
  const int base = (eax >> 8) & 0xf;
  return base == 0xf ? base + static_cast<int>((eax >> 20) & 0xff) : base;
}

// f32 FLOP per cycle per core. Where a family has both one and two wide FMA units the larger
// is taken: a stated peak may be above what a core reaches, never below.
void flops_per_cycle(CpuPeak& p) {
  __builtin_cpu_init();
  const bool amd = __builtin_cpu_is("amd");
  if (__builtin_cpu_supports("avx512f")) {
    // Zen 4 runs 512-bit FMAs on two 256-bit units; Zen 5 and Intel's server cores have two
    // 512-bit FMA units.
    if (amd && cpu_family() < 0x1a) {
      p.flops_per_cycle = 32, p.basis = "AVX-512 on 2x256-bit FMA";
    } else {
      p.flops_per_cycle = 64, p.basis = "AVX-512, 2x512-bit FMA";
    }
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.flops_per_cycle = 32, p.basis = "AVX2 + FMA, 2x256-bit FMA";
  } else if (__builtin_cpu_supports("avx")) {
    p.flops_per_cycle = 16, p.basis = "AVX, 256-bit add + mul";
  } else {
    p.flops_per_cycle = 8, p.basis = "SSE, 128-bit add + mul";
  }
}

// The highest clock any CPU reports: cpufreq's maximum where the kernel has it, else the
// largest "cpu MHz" in /proc/cpuinfo (a virtual machine's guests often see only that).
double reported_ghz() {
  double khz = 0;
  if (std::ifstream f("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"); f >> khz && khz > 0)
    return khz / 1e6;
  std::ifstream info("/proc/cpuinfo");
  double mhz = 0;
  for (std::string line; std::getline(info, line);)
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) mhz = std::max(mhz, std::atof(line.c_str() + colon + 1));
    }
  return mhz / 1e3;
}

int cores_of_process(int local_ranks) {
  return std::max(1, std::min(cpu_share(cpu_budget_of_process(local_ranks)), omp_get_max_threads()));
}

}  // namespace

double measure_clock_ghz() {
#if defined(__x86_64__)
  constexpr long iterations = 4'000'000, adds_per_iteration = 10;
  double best = 0.0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    long counter = iterations, value = 0;
    const long one = 1;
    const auto start = std::chrono::steady_clock::now();
    // Register adds, one cycle each in a dependent chain. Not `add $1`: newer Intel cores fold
    // an immediate add into the rename stage, and that chain timed a 15 GHz clock.
    asm volatile(
        "1:\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "dec %1\n\tjnz 1b"
        : "+r"(value), "+r"(counter)
        : "r"(one));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(iterations * adds_per_iteration) / seconds * 1e-9);
  }
  return best;
#else
  return 0.0;
#endif
}

double CpuPeak::flops() const {
  return overridden ? override_flops : cores * static_cast<double>(flops_per_cycle) * ghz * 1e9;
}

std::string CpuPeak::describe() const {
  char buf[256];
  if (overridden) {
    std::snprintf(buf, sizeof buf, "%.1f GFLOP/s (MOD_CPU_PEAK_GFLOPS)", flops() / 1e9);
  } else {
    char clock[64] = "reported";
    if (ghz > reported_ghz)
      std::snprintf(clock, sizeof clock, "timed; the system reports %.2f", reported_ghz);
    std::snprintf(buf, sizeof buf, "%d core%s x %d FLOP/cycle (%s) x %.2f GHz (%s) = %.1f GFLOP/s",
                  cores, cores == 1 ? "" : "s", flops_per_cycle, basis.c_str(), ghz, clock,
                  flops() / 1e9);
  }
  return buf;
}

CpuPeak cpu_peak(int local_ranks) {
  CpuPeak p;
  flops_per_cycle(p);
  // Timed once per process; a stated peak below the real clock would let MFU pass 100%.
  static const double timed = measure_clock_ghz();
  p.reported_ghz = reported_ghz();
  p.ghz = std::max({p.reported_ghz, timed, 0.1});
  p.cores = cores_of_process(local_ranks);
  if (const char* env = std::getenv("MOD_CPU_PEAK_GFLOPS")) {
    char* end = nullptr;
    const double gflops = std::strtod(env, &end);
    if (end == env || *end != '\0' || !(gflops > 0))
      throw std::invalid_argument(std::string("MOD_CPU_PEAK_GFLOPS: expected a positive number "
                                              "of GFLOP/s per process, got '") + env + "'");
    p.overridden = true;
    p.override_flops = gflops * 1e9;
  }
  return p;
}

}  // namespace mod::cpu
