// blas_sgemm's view of the CPU: model, cores, vector ISA and the clock GEMM actually runs at,
// from which the theoretical fp32 peak follows.
#pragma once

#include <string>

namespace mod::blas_bench {

struct CpuDescription {
  std::string model = "unknown";
  std::string isa;
  double ghz = 0.0;
  double measured_ghz_one = 0.0;
  double measured_ghz_all = 0.0;
  int cores = 0;
  int flops_per_cycle = 0;
};

// Theoretical peak inputs from /proc/cpuinfo: FLOPs/cycle/core assumes two
// FMA pipes (2 pipes x 2 flops x 8 fp32 lanes = 32 for AVX2, 64 for AVX-512);
// AVX-512 parts with a single 512-bit FMA pipe peak at half that.
CpuDescription describe_cpu();

}  // namespace mod::blas_bench
