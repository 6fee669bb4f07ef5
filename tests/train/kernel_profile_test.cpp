// train.profile_steps' summary: kernel names shortened from CUPTI's mangled ones, time summed
// by kernel, and the device's busy time as the union of overlapping records (a copy on another
// stream under a kernel counts once), and the idle gaps between busy stretches; collectives'
// overlap with the other kernels (issue: gradients reduced while backward runs).
#include "train/metrics/kernel_profile.h"

#include <catch2/catch.hpp>

using namespace mod;
using namespace mod::train;

TEST_CASE("kernel names lose return type, namespaces and parameters", "[profile]") {
  // void mod::cuda::(anonymous namespace)::gather_rows_copy<uint4, long>(uint4 const*, long)
  CHECK(short_kernel_name("_ZN3mod4cuda12_GLOBAL__N_116gather_rows_copyI5uint4lEEvPKT_l") ==
        "gather_rows_copy<uint4, long>");
  // void cutlass::Kernel2<cutlass_80_wmma<a, b>>(Params)
  CHECK(short_kernel_name("void cutlass::Kernel2<cutlass_80_wmma<a, b::c>>(Params)") ==
        "Kernel2<cutlass_80_wmma<a, b::c>>");
  CHECK(short_kernel_name("nvjet_sm90_hsh_256x128_64x4_2x1_v_bz_coopA_NNT") ==
        "nvjet_sm90_hsh_256x128_64x4_2x1_v_bz_coopA_NNT");
  CHECK(short_kernel_name("[memcpy HtoD]") == "[memcpy HtoD]");
  CHECK(short_kernel_name("gemm NT 2048x768x256") == "gemm NT 2048x768x256");  // a CPU op
}

TEST_CASE("a profile sums by kernel and counts overlapping time once", "[profile]") {
  const std::vector<DeviceActivity> records = {
      {"gemm", 1'000'000, 3'000'000},     // 2 ms
      {"[memcpy DtoH]", 2'000'000, 4'000'000},  // overlaps the gemm by 1 ms
      {"norm", 10'000'000, 10'500'000},   // a gap of 6 ms before it
      {"gemm", 11'000'000, 14'000'000},   // 3 ms
  };
  const KernelProfile p = summarize(records, 2);
  REQUIRE(p.rows.size() == 3);
  CHECK(p.rows[0].name == "gemm");
  CHECK(p.rows[0].calls == 2);
  CHECK(p.rows[0].total_ms == Approx(5.0));
  CHECK(p.rows[1].name == "[memcpy DtoH]");
  CHECK(p.rows[2].total_ms == Approx(0.5));
  CHECK(p.busy_ms == Approx(3.0 + 0.5 + 3.0));  // [1,4] + [10,10.5] + [11,14]
  CHECK(p.span_ms == Approx(13.0));
  REQUIRE(p.gaps.size() == 2);  // longest first, named by the records on either side
  CHECK(p.gaps[0].ms == Approx(6.0));
  CHECK(p.gaps[0].after == "[memcpy DtoH]");  // it ended the busy stretch, not the gemm
  CHECK(p.gaps[0].before == "norm");
  CHECK(p.gaps[1].ms == Approx(0.5));
  CHECK(p.gaps[1].after == "norm");
  const std::string table = format_profile(p, 2);
  CHECK(table.find("busy 3.25 ms of 6.50 ms a step (50.0% idle), 2 launches a step") !=
        std::string::npos);
  CHECK(table.find("  norm\n") == std::string::npos);  // only the top two rows
  CHECK(table.find("6.000 ms after [memcpy DtoH], before norm\n") != std::string::npos);
}

TEST_CASE("a CPU op profile says what the ops with a FLOP count reach together", "[profile]") {
  // 4 ms of GEMMs doing 0.6 GFLOP (150 GFLOP/s) and 1 ms of an elementwise op.
  std::vector<DeviceActivity> records = {{"gemm NT 64x64x64", 0, 1'000'000, 1e8},
                                         {"gemm TN 64x64x64", 1'000'000, 4'000'000, 5e8},
                                         {"gelu_forward", 4'000'000, 5'000'000, 0}};
  KernelProfile p = summarize(records, 1);
  p.cpu_ops = true;
  const std::string table = format_profile(p, 3);
  INFO(table);
  CHECK(table.find("those with a FLOP count (GEMMs): 80.0% of the time, at 150.0 GFLOP/s "
                   "together\n") != std::string::npos);
  p.sgemm_flops = 200e9;  // and against an SGEMM timed after the window
  CHECK(format_profile(p, 3).find("at 150.0 GFLOP/s together, 75% of a 1024^3 SGEMM timed after "
                                  "the window (200.0)\n") != std::string::npos);
  records.pop_back();
  for (DeviceActivity& r : records) r.flop = 0;  // nothing counted: no such line
  CHECK(format_profile(summarize(records, 1), 3).find("FLOP count") == std::string::npos);
}

// Two NCCL kernels on the comm stream (overlapping each other) beside compute kernels: the
// collectives' union is [5,13] ms, compute's [0,10] + [12,20]; both in flight [5,10] + [12,13].
TEST_CASE("a profile measures how much of the collectives ran under other kernels", "[profile]") {
  const std::vector<DeviceActivity> records = {
      {"gemm", 0, 10'000'000},
      {"ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 5'000'000,
       11'000'000},
      {"ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
       9'000'000, 13'000'000},
      {"norm", 12'000'000, 20'000'000},
  };
  const KernelProfile p = summarize(records, 2);
  CHECK(is_collective_kernel(p.rows.back().name));  // the reduce-scatter, 4 ms
  CHECK_FALSE(is_collective_kernel(p.rows.front().name));  // the gemm
  CHECK(p.comm_ms == Approx(8.0));
  CHECK(p.compute_ms == Approx(18.0));
  CHECK(p.overlap_ms == Approx(6.0));
  const std::string text = format_profile(p, 10);
  INFO(text);
  CHECK(text.find("collectives (nccl*) 4.000 ms a step, 75.0% of it under other kernels "
                  "(1.000 ms exposed); the other kernels had one in flight 33.3% of their 9.000 "
                  "ms") != std::string::npos);

  const KernelProfile none = summarize({records[0], records[3]}, 1);
  CHECK(none.comm_ms == 0.0);
  CHECK(format_profile(none, 10).find("collectives") == std::string::npos);
}
