// The checking modes each catch a planted bug of their class: a reduction missing a
// __syncthreads gives a wrong sum under the random schedule, a reduction reading slots no
// thread wrote gives NaN under poisoned shared memory, a shuffle naming a lane that never
// comes and a __syncthreads in divergent code are errors naming the threads, never hangs.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "emu/simt.h"

namespace {

emu::Options random_schedule(uint64_t seed) {
  emu::Options o;
  o.random_schedule = true;
  o.seed = seed;
  return o;
}

template <typename... P, typename... A>
emu::Status run(const char* name, const emu::Options& o, dim3 grid, dim3 block,
                void (*kernel)(P...), A... args) {
  return emu::launch(emu::LaunchConfig{grid, block, 0, name, &o}, kernel, args...);
}

// Planted bug: the fold's loop lacks its __syncthreads. Data flows from lower threads to
// higher ones, so running threads in order happens to be right; other orders are not.
__global__ void top_fold_sum_missing_sync(const float* in, float* out) {
  __shared__ float s[1024];
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  s[t] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (int stride = n / 2; stride > 0; stride >>= 1) {
    if (t >= n - stride) s[t] += s[t - stride];
  }
  __syncthreads();
  if (t == n - 1) out[blockIdx.x] = s[n - 1];
}

// Planted bug: the fold runs to the next power of two and reads slots past the block's threads
// (the bound `t + stride < blockDim.x` is missing). Zeroed memory hides it; poison does not.
MOD_EMU_DYNAMIC_SHARED(float, slots)
__global__ void sum_reading_unwritten_slots(const float* in, float* out) {
  extern __shared__ float slots[];
  const unsigned t = threadIdx.x;
  slots[t] = in[t];
  __syncthreads();
  unsigned half = 1;
  while (half < blockDim.x) half *= 2;
  for (unsigned stride = half / 2; stride > 0; stride >>= 1) {
    if (t < stride) slots[t] += slots[t + stride];
    __syncthreads();
  }
  if (t == 0) out[0] = slots[0];
}
__global__ void clear_slots(int count) {
  extern __shared__ float slots[];
  for (int i = static_cast<int>(threadIdx.x); i < count; i += static_cast<int>(blockDim.x))
    slots[i] = 0.0f;
}

// Planted bug: lane 31 skips the shuffle its mask names, and exits.
__global__ void shuffle_lane_never_comes(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if ((threadIdx.x & 31) != 31) v += __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}
// Planted bug: lane 31 waits at a __syncthreads instead of the shuffle.
__global__ void shuffle_lane_waits_elsewhere(float* out) {
  float v = static_cast<float>(threadIdx.x);
  if ((threadIdx.x & 31) != 31)
    v += __shfl_xor_sync(0xffffffffu, v, 1);
  else
    __syncthreads();
  out[threadIdx.x] = v;
}

// Planted bug: a __syncthreads only the first two warps reach.
__global__ void syncthreads_in_divergent_branch(float* out) {
  if (threadIdx.x < 64) {
    out[threadIdx.x] = 1.0f;
    __syncthreads();
  }
}
// Planted bug: both branches synchronise, at different barriers.
__global__ void syncthreads_on_both_branches(float* out) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void mask_without_caller(unsigned* out) {
  out[threadIdx.x] = __ballot_sync(0x0000fffeu, 1);
}
__global__ void bad_width(int* out) {
  out[threadIdx.x] = __shfl_down_sync(~0u, 1, 1, 12);
}
__global__ void full_mask_in_partial_warp(float* out) {
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<float>(threadIdx.x), 16);
}
__global__ void traps(int* out) {
  if (threadIdx.x == 5) __trap();
  out[threadIdx.x] = 1;
}
__global__ void throws(int) {
  throw std::runtime_error("index out of range");
}
__global__ void record_block_order(unsigned* counter, unsigned* order) {
  if (threadIdx.x == 0) order[atomicAdd(counter, 1u)] = blockIdx.x;
}

}  // namespace

TEST_CASE("planted: a reduction missing __syncthreads is wrong under the random schedule",
          "[emulator]") {
  const int blocks = 2, threads = 256;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7);
  float want[blocks] = {0, 0};
  for (size_t i = 0; i < in.size(); ++i) want[i / threads] += in[i];
  std::vector<float> out(blocks);

  REQUIRE(run("top_fold_sum_missing_sync", emu::Options{}, dim3(blocks), dim3(threads),
              top_fold_sum_missing_sync, in.data(), out.data())
              .ok());
  REQUIRE(out[0] == want[0]);  // in-order scheduling hides the bug
  int caught = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    REQUIRE(run("top_fold_sum_missing_sync", random_schedule(seed), dim3(blocks), dim3(threads),
                top_fold_sum_missing_sync, in.data(), out.data())
                .ok());
    caught += out[0] != want[0] || out[1] != want[1];
  }
  INFO("seeds out of 4 that gave a wrong sum: " << caught);
  REQUIRE(caught >= 1);
}

TEST_CASE("planted: reading shared memory no thread wrote gives NaN under poison", "[emulator]") {
  // 100 threads, 128 slots allocated (the next power of two): slots 100..127 are never written.
  const int threads = 100;
  std::vector<float> in(threads, 1.0f);
  float out = -1;
  const auto launch = [&](const emu::Options& o) {
    return emu::launch(
        emu::LaunchConfig{dim3(1), dim3(threads), 128 * sizeof(float), "sum_reading", &o},
        sum_reading_unwritten_slots, in.data(), &out);
  };
  // Zeroed memory (as a fresh GPU allocation often is) hides the bug...
  REQUIRE(emu::launch(dim3(1), dim3(128), 128 * sizeof(float), clear_slots, 128).ok());
  REQUIRE(launch(emu::Options{}).ok());
  REQUIRE(out == 100.0f);
  // ...poison shows it.
  emu::Options poison;
  poison.poison_shared = true;
  REQUIRE(launch(poison).ok());
  REQUIRE(std::isnan(out));
}

TEST_CASE("planted: a shuffle naming a lane that never comes is an error", "[emulator]") {
  std::vector<float> out(64);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const emu::Options o = seed ? random_schedule(seed) : emu::Options{};
    const emu::Status exits =
        run("shuffle_lane_never_comes", o, dim3(2), dim3(64), shuffle_lane_never_comes, out.data());
    INFO(exits.message);
    REQUIRE(exits.code == emu::ErrorCode::kSynccheck);
    REQUIRE_THAT(exits.message, Catch::Contains("kernel shuffle_lane_never_comes, block (") &&
                                    Catch::Contains("__shfl_xor_sync(mask 0xffffffff)") &&
                                    Catch::Contains("exited") &&
                                    (Catch::Contains("lane 31 (thread (31,0,0))") ||
                                     Catch::Contains("lane 31 (thread (63,0,0))") ||
                                     Catch::Contains("names lanes 31")));

    const emu::Status waits = run("shuffle_lane_waits_elsewhere", o, dim3(1), dim3(32),
                                  shuffle_lane_waits_elsewhere, out.data());
    INFO(waits.message);
    REQUIRE(waits.code == emu::ErrorCode::kSynccheck);
    REQUIRE_THAT(waits.message,
                 Catch::Contains("deadlock") &&
                     Catch::Contains("lanes 0-30 wait in __shfl_xor_sync") &&
                     Catch::Contains("lane 31 (thread (31,0,0)), which waits at __syncthreads"));
  }
}

TEST_CASE("planted: __syncthreads in divergent code is an error", "[emulator]") {
  std::vector<float> out(256);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const emu::Options o = seed ? random_schedule(seed) : emu::Options{};
    const emu::Status s = run("syncthreads_in_divergent_branch", o, dim3(1), dim3(256),
                              syncthreads_in_divergent_branch, out.data());
    INFO(s.message);
    REQUIRE(s.code == emu::ErrorCode::kSynccheck);
    REQUIRE_THAT(s.message, Catch::Contains("kernel syncthreads_in_divergent_branch, block "
                                            "(0,0,0)") &&
                                Catch::Contains("__syncthreads in divergent code"));
    const emu::Status both = run("syncthreads_on_both_branches", o, dim3(1), dim3(64),
                                 syncthreads_on_both_branches, out.data());
    INFO(both.message);
    REQUIRE(both.code == emu::ErrorCode::kSynccheck);
    REQUIRE_THAT(both.message, Catch::Contains("different barriers"));
  }
}

TEST_CASE("misused warp masks and widths are errors", "[emulator]") {
  std::vector<unsigned> u(32);
  const emu::Status caller =
      run("mask_without_caller", emu::Options{}, dim3(1), dim3(32), mask_without_caller, u.data());
  REQUIRE(caller.code == emu::ErrorCode::kSynccheck);
  REQUIRE_THAT(caller.message, Catch::Contains("__ballot_sync(mask 0x0000fffe)") &&
                                   Catch::Contains("thread (0,0,0)") &&
                                   Catch::Contains("does not name the calling lane"));
  std::vector<int> i(32);
  const emu::Status width =
      run("bad_width", emu::Options{}, dim3(1), dim3(32), bad_width, i.data());
  REQUIRE(width.code == emu::ErrorCode::kSynccheck);
  REQUIRE_THAT(width.message, Catch::Contains("width 12 is not a power of two"));

  // A block of 48 threads has a warp of 16 lanes: a full mask names 16 lanes that do not exist.
  std::vector<float> f(48);
  const emu::Status partial = run("full_mask_in_partial_warp", emu::Options{}, dim3(1), dim3(48),
                                  full_mask_in_partial_warp, f.data());
  REQUIRE(partial.code == emu::ErrorCode::kSynccheck);
  REQUIRE_THAT(partial.message,
               Catch::Contains("names lanes 16-31, which the block does not have"));
  // The Guide's reading excuses them; what lanes 0-15 would read from them is poison.
  emu::Options lax;
  lax.excuse_exited_lanes = true;
  REQUIRE(
      run("full_mask_in_partial_warp", lax, dim3(1), dim3(48), full_mask_in_partial_warp, f.data())
          .ok());
  for (int t = 0; t < 32; ++t)
    REQUIRE(f[static_cast<size_t>(t)] == static_cast<float>(t < 16 ? t + 16 : t));
  for (int t = 32; t < 48; ++t) REQUIRE(std::isnan(f[static_cast<size_t>(t)]));
}

TEST_CASE("__trap and a throwing kernel fail the launch, later launches run", "[emulator]") {
  std::vector<int> out(64);
  const emu::Status trap = run("traps", emu::Options{}, dim3(2), dim3(64), traps, out.data());
  REQUIRE(trap.code == emu::ErrorCode::kLaunchFailure);
  REQUIRE_THAT(trap.message, Catch::Contains("thread (5,0,0) called __trap()"));
  const emu::Status thrown = run("throws", emu::Options{}, dim3(1), dim3(8), throws, 0);
  REQUIRE(thrown.code == emu::ErrorCode::kLaunchFailure);
  REQUIRE_THAT(thrown.message, Catch::Contains("threw: index out of range"));
  REQUIRE(run("traps", emu::Options{}, dim3(1), dim3(5), traps, out.data()).ok());
}

TEST_CASE("the random schedule runs blocks in a seeded order", "[emulator]") {
  const auto order_of = [](const emu::Options& o) {
    unsigned counter = 0;
    std::vector<unsigned> order(50);
    REQUIRE(
        run("record_block_order", o, dim3(50), dim3(4), record_block_order, &counter, order.data())
            .ok());
    return order;
  };
  std::vector<unsigned> in_order(50);
  for (unsigned b = 0; b < 50; ++b) in_order[b] = b;
  REQUIRE(order_of(emu::Options{}) == in_order);
  const std::vector<unsigned> a = order_of(random_schedule(7)), b = order_of(random_schedule(8));
  REQUIRE(a == order_of(random_schedule(7)));  // the seed alone decides
  REQUIRE(a != in_order);
  REQUIRE(a != b);
  REQUIRE(std::set<unsigned>(a.begin(), a.end()).size() == 50);
}
