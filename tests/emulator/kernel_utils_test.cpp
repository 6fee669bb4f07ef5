// A project kernel helper runs unchanged on the emulator: core/cuda/kernel_utils.cuh (block_sum,
// warp_sum, warp_max) is included as it is, after emulator/include/emu/simt.h, and a block sum
// over it matches the CPU's. Built where the toolkit's headers are (kernel_utils.cuh includes
// cuda_runtime.h and, through stream.h, cuBLAS's: declarations only, nothing is linked).
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "emu/simt.h"
// The toolkit's cuda_runtime.h, included by kernel_utils.cuh, re-includes host_defines.h, whose
// guard keeps the emulator's qualifier macros in force.
#include "core/cuda/kernel_utils.cuh"

namespace {

template <typename A>
__global__ void block_sums(const A* in, A* sum, A* warp_maxima, int n) {
  __shared__ A scratch[32];
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const A v = i < n ? in[i] : A(0);
  const A total = mod::cuda::block_sum(v, scratch);
  const A m = mod::cuda::warp_max(v);
  if (threadIdx.x == 0) sum[blockIdx.x] = total;
  if ((threadIdx.x & 31) == 0) warp_maxima[i / 32] = m;
}

template <typename A>
void check(int threads, const emu::Options& options) {
  const int blocks = 5, n = blocks * threads - 7;
  std::vector<A> in(static_cast<size_t>(blocks * threads));
  for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = A((i * 29) % 97) / A(8);
  std::vector<A> sum(blocks), maxima(static_cast<size_t>(blocks * threads / 32));
  REQUIRE(emu::launch(emu::LaunchConfig{dim3(blocks), dim3(threads), 0, "block_sums", &options},
                      block_sums<A>, in.data(), sum.data(), maxima.data(), n)
              .ok());
  for (int b = 0; b < blocks; ++b) {
    A want = 0;  // eighths of small integers: exact in any order
    for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i)
      want += in[static_cast<size_t>(i)];
    INFO("threads " << threads << " block " << b);
    REQUIRE(sum[static_cast<size_t>(b)] == want);
  }
  for (size_t w = 0; w < maxima.size(); ++w) {
    A want = 0;
    for (size_t l = 0; l < 32; ++l) want = std::max(want, in[w * 32 + l]);
    REQUIRE(maxima[w] == want);
  }
}

}  // namespace

TEST_CASE("core/cuda/kernel_utils.cuh's block_sum runs unchanged and matches the CPU",
          "[emulator]") {
  emu::Options random;
  random.random_schedule = true;
  for (int threads : {32, 96, 256, 800, 1024}) {
    check<float>(threads, emu::Options{});
    check<double>(threads, emu::Options{});
    for (uint64_t seed : {1u, 2u}) {
      random.seed = seed;
      check<float>(threads, random);
    }
  }
}
