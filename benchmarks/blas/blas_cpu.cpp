// Reading /proc/cpuinfo and timing the core clock (blas_cpu.h).
#include "benchmarks/blas/blas_cpu.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/cpu/cpu_peak.h"

namespace mod::blas_bench {

// Theoretical peak inputs from /proc/cpuinfo: FLOPs/cycle/core assumes two
// FMA pipes (2 pipes x 2 flops x 8 fp32 lanes = 32 for AVX2, 64 for AVX-512);
// AVX-512 parts with a single 512-bit FMA pipe peak at half that.
CpuDescription describe_cpu() {
  CpuDescription cpu;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, flags;
  int siblings = 0, cpu_cores = 0;
  auto value_of = [](const std::string& text) {
    auto colon = text.find(':');
    if (colon == std::string::npos) return std::string();
    auto start = text.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : text.substr(start);
  };
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0 && cpu.model == "unknown")
      cpu.model = value_of(line);
    else if (line.rfind("cpu MHz", 0) == 0 && cpu.ghz == 0.0)
      cpu.ghz = std::atof(value_of(line).c_str()) / 1000.0;
    else if (line.rfind("flags", 0) == 0 && flags.empty())
      flags = " " + value_of(line) + " ";
    else if (line.rfind("siblings", 0) == 0 && siblings == 0)
      siblings = std::atoi(value_of(line).c_str());
    else if (line.rfind("cpu cores", 0) == 0 && cpu_cores == 0)
      cpu_cores = std::atoi(value_of(line).c_str());
  }
  // Prefer the advertised maximum frequency where cpufreq exposes it (not in most VMs).
  std::ifstream max_freq("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq");
  if (double khz = 0; max_freq >> khz && khz > 0) cpu.ghz = khz / 1e6;
  int threads_per_core = (siblings > 0 && cpu_cores > 0) ? std::max(1, siblings / cpu_cores) : 1;
  cpu.cores = std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)) / threads_per_core);
  auto has = [&](const char* flag) {
    return flags.find(" " + std::string(flag) + " ") != std::string::npos;
  };
  cpu.isa = std::string("AVX2 ") + (has("avx2") ? "yes" : "no") + ", FMA " +
            (has("fma") ? "yes" : "no") + ", AVX-512F " + (has("avx512f") ? "yes" : "no");
  if (has("avx512f"))
    cpu.flops_per_cycle = 64;
  else if (has("avx2") && has("fma"))
    cpu.flops_per_cycle = 32;
  else if (has("avx"))
    cpu.flops_per_cycle = 16;
  else
    cpu.flops_per_cycle = 8;
  cpu.measured_ghz_one = cpu::measure_clock_ghz();
  // All cores busy at once: the all-core clock is usually lower than the 1-core boost.
  double slowest = 1e9;
#pragma omp parallel num_threads(cpu.cores) reduction(min : slowest)
  slowest = cpu::measure_clock_ghz();
  cpu.measured_ghz_all = slowest;
  return cpu;
}

}  // namespace mod::blas_bench
