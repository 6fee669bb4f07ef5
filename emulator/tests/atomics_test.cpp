// Atomics from many blocks: every listed type adds up, old values are handed out once each,
// CAS loops survive interleaving (random schedule with a suspension at every atomic), and bf16
// adds round each step to nearest even exactly as a sequential reference written here does.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "emu/simt.h"

namespace {

struct Counters {
  int i = 0;
  unsigned u = 0;
  unsigned long long ull = 0;
  float f = 0;
  double d = 0;
  int max = -1;
  int min = 1 << 30;
  unsigned cas = 0;
  int exch = -1;
  unsigned long long umax = 0;
};

__global__ void integer_and_float_atomics(Counters* c, int* olds) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  olds[g] = atomicAdd(&c->i, 1);
  atomicAdd(&c->u, 3u);
  atomicAdd(&c->ull, 1ull << 33);
  atomicAdd(&c->f, static_cast<float>(g % 8) * 0.5f);
  atomicAdd(&c->d, static_cast<double>(g % 5) * 0.25);
  atomicMax(&c->max, (g * 7919) % 10007);
  atomicMin(&c->min, (g * 7919) % 10007 - 5000);
  atomicMax(&c->umax, static_cast<unsigned long long>(g) << 40);
  unsigned old = c->cas, assumed;
  do {
    assumed = old;
    old = atomicCAS(&c->cas, assumed, assumed + 2);
  } while (old != assumed);
  atomicExch(&c->exch, g);
}

__global__ void bf16_atomics(__nv_bfloat16* ones, __nv_bfloat16* varied, __nv_bfloat162* pair) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const float v = 0.01f * static_cast<float>(g % 13 + 1);
  atomicAdd(ones, __float2bfloat16(1.0f));
  atomicAdd(varied, __float2bfloat16(v));
  atomicAdd(pair, __floats2bfloat162_rn(1.0f, v));
}

// The reference rounding, from the bf16 format itself: keep the top 16 bits of the float,
// rounding to nearest with ties to even.
float round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t low = u & 0xffffu, keep = u >> 16;
  const uint32_t up = low > 0x8000u || (low == 0x8000u && (keep & 1u));
  u = (keep + up) << 16;
  std::memcpy(&f, &u, 4);
  return f;
}

void check_counters(const emu::Options& options) {
  const int blocks = 40, threads = 96, n = blocks * threads;
  Counters c;
  std::vector<int> olds(n, -1);
  REQUIRE(emu::launch(emu::LaunchConfig{dim3(blocks), dim3(threads), 0, "atomics", &options},
                      integer_and_float_atomics, &c, olds.data())
              .ok());
  REQUIRE(c.i == n);
  REQUIRE(c.u == 3u * n);
  REQUIRE(c.ull == (1ull << 33) * n);
  float f = 0;
  double d = 0;
  int mx = -1, mn = 1 << 30;
  for (int g = 0; g < n; ++g) {
    f += static_cast<float>(g % 8) * 0.5f;  // halves of small integers: exact in any order
    d += static_cast<double>(g % 5) * 0.25;
    mx = std::max(mx, (g * 7919) % 10007);
    mn = std::min(mn, (g * 7919) % 10007 - 5000);
  }
  REQUIRE(c.f == f);
  REQUIRE(c.d == d);
  REQUIRE(c.max == mx);
  REQUIRE(c.min == mn);
  REQUIRE(c.umax == static_cast<unsigned long long>(n - 1) << 40);
  REQUIRE(c.cas == 2u * n);
  REQUIRE(c.exch >= 0);
  REQUIRE(c.exch < n);
  std::sort(olds.begin(), olds.end());
  for (int g = 0; g < n; ++g) REQUIRE(olds[static_cast<size_t>(g)] == g);  // each old value once
}

}  // namespace

TEST_CASE("int, unsigned, u64, float and double atomics from many blocks", "[emulator]") {
  check_counters(emu::Options{});
  emu::Options interleaved;
  interleaved.random_schedule = true;
  interleaved.yield_at_atomics = true;
  for (uint64_t seed : {1u, 2u, 3u}) {
    interleaved.seed = seed;
    check_counters(interleaved);
  }
}

TEST_CASE("bf16 atomicAdd rounds each add to nearest even", "[emulator]") {
  // The rounding itself, on ties: 1 + 2^-8 lies between 1 and 1 + 2^-7 and goes to even (1);
  // 1 + 3 * 2^-8 goes up to 1 + 2^-6.
  REQUIRE(__bfloat162float(__float2bfloat16(1.00390625f)) == 1.0f);
  REQUIRE(__bfloat162float(__float2bfloat16(1.01171875f)) == 1.015625f);
  REQUIRE(round_bf16(1.01171875f) == 1.015625f);

  const int blocks = 64, threads = 128;
  __nv_bfloat16 ones = __float2bfloat16(0.0f), varied = __float2bfloat16(0.0f);
  __nv_bfloat162 pair = __floats2bfloat162_rn(0.0f, 0.0f);
  REQUIRE(MOD_EMU_LAUNCH(bf16_atomics, dim3(blocks), dim3(threads), 0, &ones, &varied, &pair).ok());
  // The default schedule runs threads in order, block after block: the reference adds so.
  float want_ones = 0, want_varied = 0;
  for (int g = 0; g < blocks * threads; ++g) {
    want_ones = round_bf16(want_ones + 1.0f);
    want_varied = round_bf16(want_varied + round_bf16(0.01f * static_cast<float>(g % 13 + 1)));
  }
  REQUIRE(want_ones == 256.0f);  // 256 + 1 ties back to 256: the sum stops there
  REQUIRE(__bfloat162float(ones) == want_ones);
  REQUIRE(__bfloat162float(varied) == want_varied);
  REQUIRE(__low2float(pair) == want_ones);
  REQUIRE(__high2float(pair) == want_varied);
}
