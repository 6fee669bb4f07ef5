// Speed of the emulator, printed and not asserted ([.bench]: run on request,
// `emulator_tests "[.bench]"`): threads run per second, barrier suspensions per second and
// warp shuffles per second, on the default in-order schedule.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "emu/simt.h"

namespace {

__global__ void touch(int* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

__global__ void barriers(int iterations, int* out) {
  int x = static_cast<int>(threadIdx.x);
  for (int i = 0; i < iterations; ++i) {
    x += i;
    __syncthreads();
  }
  out[threadIdx.x] = x;
}

__global__ void shuffles(int iterations, float* out) {
  float v = static_cast<float>(threadIdx.x);
  for (int i = 0; i < iterations; ++i) v += __shfl_xor_sync(0xffffffffu, v, i & 31);
  out[threadIdx.x] = v;
}

template <typename F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("emulator speed", "[emulator][.bench]") {
  const int blocks = 512, threads = 256;
  std::vector<int> out(blocks * threads);
  const double launch_s = seconds(
      [&] { REQUIRE(MOD_EMU_LAUNCH(touch, dim3(blocks), dim3(threads), 0, out.data()).ok()); });
  const int iterations = 200, barrier_blocks = 32;
  const double barrier_s = seconds([&] {
    REQUIRE(
        MOD_EMU_LAUNCH(barriers, dim3(barrier_blocks), dim3(1024), 0, iterations, out.data()).ok());
  });
  std::vector<float> f(1024);
  const double shuffle_s = seconds([&] {
    REQUIRE(
        MOD_EMU_LAUNCH(shuffles, dim3(barrier_blocks), dim3(1024), 0, iterations, f.data()).ok());
  });
  const double suspensions = 1.0 * barrier_blocks * 1024 * iterations;
  std::printf(
      "emulator: %.2f M threads/s (%d blocks of %d, a store each); "
      "%.2f M barrier suspensions/s (__syncthreads x %d in %d blocks of 1024); "
      "%.2f M lane-shuffles/s\n",
      blocks * threads / launch_s / 1e6, blocks, threads, suspensions / barrier_s / 1e6, iterations,
      barrier_blocks, suspensions / shuffle_s / 1e6);
}
