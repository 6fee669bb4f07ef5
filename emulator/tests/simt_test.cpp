// The emulator runs kernels with CUDA's semantics: thread and block indices over 1-D, 2-D and
// 3-D grids, per-thread copies of the arguments, shared-memory block sums with __syncthreads,
// the __syncthreads predicate forms, extern __shared__ sized at launch, launch-config errors.
#include "emu/simt.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

namespace {

__global__ void write_indices(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  unsigned* o = out + 6 * (block * blockDim.x * blockDim.y * blockDim.z + thread);
  o[0] = threadIdx.x, o[1] = threadIdx.y, o[2] = threadIdx.z;
  o[3] = blockIdx.x, o[4] = blockIdx.y, o[5] = blockIdx.z;
}

// Sum of each block's slice by a shared-memory tree; any block size up to 1024.
__global__ void block_sum_shared(const float* in, float* out, int n) {
  __shared__ float s[1024];
  const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = i < unsigned(n) ? in[i] : 0.0f;
  __syncthreads();
  unsigned half = 1;
  while (half * 2 < blockDim.x) half *= 2;
  for (unsigned stride = half; stride > 0; stride >>= 1) {
    if (t < stride && t + stride < blockDim.x) s[t] += s[t + stride];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// Each thread changes its own copy of `n`; none may see another's change.
__global__ void own_argument_copies(int n, int* out) {
  n += static_cast<int>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = n;
}

__global__ void barrier_predicates(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int count = __syncthreads_count(t % 3 == 0);
  const int all = __syncthreads_and(t < 1000);
  const int any = __syncthreads_or(t == 77);
  const int none = __syncthreads_or(0);
  if (t == 0) out[0] = count, out[1] = all, out[2] = any, out[3] = none;
}

// extern __shared__ as the project's kernels declare it, in an anonymous namespace.
MOD_EMU_DYNAMIC_SHARED(unsigned char, smem)
__global__ void use_dynamic_shared(size_t bytes, unsigned long long* out) {
  extern __shared__ __align__(16) unsigned char smem[];
  for (size_t i = threadIdx.x; i < bytes; i += blockDim.x)
    smem[i] = static_cast<unsigned char>(i * 7 + blockIdx.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    for (size_t i = 0; i < bytes; ++i) sum += smem[i];
    out[blockIdx.x] = sum;
    out[gridDim.x + blockIdx.x] = emu::dynamic_shared_bytes();
    out[2 * gridDim.x + blockIdx.x] = reinterpret_cast<uintptr_t>(smem) % 16;
  }
}

void check_indices(dim3 grid, dim3 block) {
  const size_t threads = size_t{grid.x} * grid.y * grid.z * block.x * block.y * block.z;
  std::vector<unsigned> out(6 * threads, ~0u);
  REQUIRE(MOD_EMU_LAUNCH(write_indices, grid, block, 0, out.data()).ok());
  size_t at = 0;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx)
        for (unsigned tz = 0; tz < block.z; ++tz)
          for (unsigned ty = 0; ty < block.y; ++ty)
            for (unsigned tx = 0; tx < block.x; ++tx, at += 6) {
              const std::vector<unsigned> got(out.begin() + static_cast<long>(at),
                                              out.begin() + static_cast<long>(at + 6));
              REQUIRE(got == std::vector<unsigned>{tx, ty, tz, bx, by, bz});
            }
}

}  // namespace

TEST_CASE("threads see their indices over 1-D, 2-D and 3-D grids", "[emulator]") {
  check_indices(dim3(7), dim3(96));
  check_indices(dim3(3, 2), dim3(16, 8));
  check_indices(dim3(2, 3, 2), dim3(4, 4, 4));
  check_indices(dim3(1, 1, 3), dim3(1, 1, 64));
}

TEST_CASE("a shared-memory block sum with __syncthreads matches the CPU", "[emulator]") {
  for (int threads : {256, 1024, 100, 1000, 96, 1}) {
    const int n = threads * 5 - 3;  // the last block is partial
    std::vector<float> in(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = static_cast<float>(i % 17);
    const int blocks = (n + threads - 1) / threads;
    std::vector<float> out(static_cast<size_t>(blocks), -1.0f);
    REQUIRE(
        MOD_EMU_LAUNCH(block_sum_shared, dim3(blocks), dim3(threads), 0, in.data(), out.data(), n)
            .ok());
    for (int b = 0; b < blocks; ++b) {
      float want = 0;  // small integers: every order of addition is exact
      for (int i = b * threads; i < std::min(n, (b + 1) * threads); ++i)
        want += in[static_cast<size_t>(i)];
      INFO("threads " << threads << " block " << b);
      REQUIRE(out[static_cast<size_t>(b)] == want);
    }
  }
}

TEST_CASE("each thread gets its own copy of the kernel's arguments", "[emulator]") {
  std::vector<int> out(64);
  REQUIRE(MOD_EMU_LAUNCH(own_argument_copies, dim3(1), dim3(64), 0, 1000, out.data()).ok());
  for (int t = 0; t < 64; ++t) REQUIRE(out[static_cast<size_t>(t)] == 1000 + t);
}

TEST_CASE("__syncthreads_count, _and and _or reduce the predicate over the block", "[emulator]") {
  std::vector<int> out(4, -1);
  REQUIRE(MOD_EMU_LAUNCH(barrier_predicates, dim3(1), dim3(1000), 0, out.data()).ok());
  REQUIRE(out == std::vector<int>{334, 1, 1, 0});
}

TEST_CASE("extern __shared__ holds the bytes the launch asked for", "[emulator]") {
  const auto run = [](size_t bytes) {
    std::vector<unsigned long long> out(9, 0);
    const emu::Status s =
        MOD_EMU_LAUNCH(use_dynamic_shared, dim3(3), dim3(128), bytes, bytes, out.data());
    if (!s.ok()) return s;
    for (unsigned b = 0; b < 3; ++b) {
      unsigned long long want = 0;
      for (size_t i = 0; i < bytes; ++i) want += static_cast<unsigned char>(i * 7 + b);
      REQUIRE(out[b] == want);
      REQUIRE(out[3 + b] == bytes);
      REQUIRE(out[6 + b] == 0);  // 16-byte aligned, as __align__(16) asks
    }
    return s;
  };
  for (size_t bytes : {size_t{0}, size_t{4}, size_t{4000}, emu::kDefaultDynamicSharedBytes})
    REQUIRE(run(bytes).ok());

  // Over 48 KiB needs the opt-in, up to sm_90's 227 KiB: cudaErrorInvalidValue otherwise.
  const emu::Status over = run(emu::kDefaultDynamicSharedBytes + 4);
  REQUIRE(over.code == emu::ErrorCode::kInvalidValue);
  REQUIRE_THAT(over.message, Catch::Contains("use_dynamic_shared") &&
                                 Catch::Contains("49156 bytes of dynamic shared memory"));
  REQUIRE(emu::set_max_dynamic_shared_bytes(use_dynamic_shared, 100 * 1024).ok());
  REQUIRE(run(100 * 1024).ok());
  REQUIRE(run(100 * 1024 + 1).code == emu::ErrorCode::kInvalidValue);
  REQUIRE(
      emu::set_max_dynamic_shared_bytes(use_dynamic_shared, emu::kMaxDynamicSharedBytes + 1).code ==
      emu::ErrorCode::kInvalidValue);
  REQUIRE(emu::set_max_dynamic_shared_bytes(use_dynamic_shared, emu::kMaxDynamicSharedBytes).ok());
  REQUIRE(run(emu::kMaxDynamicSharedBytes).ok());
}

TEST_CASE("launch configurations CUDA refuses are refused with CUDA's codes", "[emulator]") {
  std::vector<unsigned> out(6 * 2048);
  const auto code = [&](dim3 grid, dim3 block) {
    return MOD_EMU_LAUNCH(write_indices, grid, block, 0, out.data()).code;
  };
  using emu::ErrorCode;
  CHECK(code(dim3(1), dim3(1025)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(1), dim3(64, 32)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(1), dim3(1, 1, 65)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(0), dim3(32)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(1), dim3(32, 0)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(1, 65536), dim3(1)) == ErrorCode::kInvalidConfiguration);
  CHECK(code(dim3(2), dim3(1024)) == ErrorCode::kSuccess);
  const emu::Status s = MOD_EMU_LAUNCH(write_indices, dim3(1), dim3(2048), 0, out.data());
  REQUIRE_THAT(s.message, Catch::Contains("kernel write_indices") && Catch::Contains("2048"));
}

TEST_CASE("the plain launch names the kernel by its symbol or address", "[emulator]") {
  std::vector<unsigned> out(6);
  const emu::Status s = emu::launch(dim3(1), dim3(2000), 0, write_indices, out.data());
  REQUIRE(s.code == emu::ErrorCode::kInvalidConfiguration);
  REQUIRE_THAT(s.message, Catch::StartsWith("kernel "));
  REQUIRE(emu::launch(dim3(1), dim3(1), 0, write_indices, out.data()).ok());
}
