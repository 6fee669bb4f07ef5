// Warp intrinsics against the CUDA Programming Guide's definitions, written out here on the
// CPU: warp reductions by __shfl_xor_sync and __shfl_down_sync, every shuffle with sub-warp
// widths, votes with partial masks, __activemask in divergent code, __syncwarp.
#include <catch2/catch.hpp>
#include <vector>

#include "emu/simt.h"

namespace {

template <typename T>
__global__ void warp_reductions(const T* in, T* xor_sum, T* down_sum, T* xor_max) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  T a = in[i], b = in[i], m = in[i];
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, static_cast<unsigned>(o));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  }
  xor_sum[i] = a;
  xor_max[i] = m;
  if ((threadIdx.x & 31) == 0) down_sum[i / 32] = b;
}

// out[4 * t + k]: shuffle k (idx, up, down, xor) of lane values 100 + t, with one width.
__global__ void shuffles(int width, int src, unsigned delta, int lane_mask, int* out) {
  const int v = 100 + static_cast<int>(threadIdx.x);
  int* o = out + 4 * threadIdx.x;
  o[0] = __shfl_sync(0xffffffffu, v, src, width);
  o[1] = __shfl_up_sync(0xffffffffu, v, delta, width);
  o[2] = __shfl_down_sync(0xffffffffu, v, delta, width);
  o[3] = __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
}

// The Guide's words, lane by lane.
int want_shuffle(int k, int lane, int width, int src, unsigned delta, int lane_mask) {
  const int group = lane / width * width, in_group = lane % width;
  switch (k) {
    case 0:
      return 100 + group + (src % width + width) % width;  // "srcLane modulo width"
    case 1:
      return 100 + (in_group >= int(delta) ? lane - int(delta) : lane);  // no wrap
    case 2:
      return 100 + (in_group + int(delta) < width ? lane + int(delta) : lane);
    default: {
      const int x = lane ^ lane_mask;  // later groups return the caller's own value
      return 100 + (x / width > lane / width ? lane : x);
    }
  }
}

// Lanes below 16 vote among themselves, the others among themselves.
__global__ void partial_votes(unsigned* out) {
  const unsigned lane = threadIdx.x & 31;
  const int pred = lane % 3 == 0;
  unsigned* o = out + 4 * threadIdx.x;
  if (lane < 16) {
    o[0] = __ballot_sync(0x0000ffffu, pred);
    o[1] = __any_sync(0x0000ffffu, lane == 5);
    o[2] = __all_sync(0x0000ffffu, lane < 16);
    o[3] = __all_sync(0x0000ffffu, pred);
  } else {
    o[0] = __ballot_sync(0xffff0000u, pred);
    o[1] = __any_sync(0xffff0000u, lane == 5);
    o[2] = __all_sync(0xffff0000u, lane >= 16);
    o[3] = __any_sync(0xffff0000u, pred);
  }
}

__global__ void active_masks(unsigned* out) {
  const unsigned lane = threadIdx.x & 31;
  out[threadIdx.x] = __activemask();
  if (lane % 2) out[blockDim.x + threadIdx.x] = __activemask();  // even lanes exit meanwhile
}

// Each lane of the lower half-warp writes, syncs with its half, and reads its neighbour.
__global__ void syncwarp_exchange(int* out) {
  __shared__ int s[32];
  const int lane = static_cast<int>(threadIdx.x);
  if (lane < 16) {
    s[lane] = lane * lane;
    __syncwarp(0x0000ffffu);
    out[lane] = s[(lane + 1) % 16];
  }
}

}  // namespace

TEST_CASE("warp reductions with __shfl_xor_sync and __shfl_down_sync", "[emulator]") {
  const int n = 256 * 3;
  std::vector<double> in(n);
  for (int i = 0; i < n; ++i) in[static_cast<size_t>(i)] = (i * 37) % 101 - 50;
  std::vector<double> xs(n), ds(n / 32), xm(n);
  REQUIRE(MOD_EMU_LAUNCH(warp_reductions<double>, dim3(3), dim3(256), 0, in.data(), xs.data(),
                         ds.data(), xm.data())
              .ok());
  std::vector<int> ii(in.begin(), in.end()), is(n), id(n / 32), im(n);
  REQUIRE(MOD_EMU_LAUNCH(warp_reductions<int>, dim3(3), dim3(256), 0, ii.data(), is.data(),
                         id.data(), im.data())
              .ok());
  for (int w = 0; w < n / 32; ++w) {
    double sum = 0, mx = -1e300;
    for (int l = 0; l < 32; ++l) {
      sum += in[static_cast<size_t>(w * 32 + l)];
      mx = std::max(mx, in[static_cast<size_t>(w * 32 + l)]);
    }
    REQUIRE(ds[static_cast<size_t>(w)] == sum);
    REQUIRE(id[static_cast<size_t>(w)] == sum);
    for (int l = 0; l < 32; ++l) {
      REQUIRE(xs[static_cast<size_t>(w * 32 + l)] == sum);
      REQUIRE(is[static_cast<size_t>(w * 32 + l)] == sum);
      REQUIRE(xm[static_cast<size_t>(w * 32 + l)] == mx);
      REQUIRE(im[static_cast<size_t>(w * 32 + l)] == mx);
    }
  }
}

TEST_CASE("shuffles honour width, clamping and out-of-range sources", "[emulator]") {
  struct Case {
    int width, src;
    unsigned delta;
    int lane_mask;
  };
  for (Case c : {Case{32, 5, 3, 1}, Case{32, 37, 31, 31}, Case{16, 3, 4, 8}, Case{16, -1, 15, 17},
                 Case{8, 9, 7, 12}, Case{4, 2, 1, 5}, Case{2, 1, 1, 1}, Case{1, 3, 1, 1}}) {
    std::vector<int> out(4 * 64);
    REQUIRE(MOD_EMU_LAUNCH(shuffles, dim3(1), dim3(64), 0, c.width, c.src, c.delta, c.lane_mask,
                           out.data())
                .ok());
    for (int t = 0; t < 64; ++t)
      for (int k = 0; k < 4; ++k) {
        INFO("width " << c.width << " thread " << t << " shuffle " << k);
        // Lanes of warp 1 shuffle within warp 1: subtract its base for the lane number.
        const int base = t / 32 * 32;
        REQUIRE(out[static_cast<size_t>(4 * t + k)] - base ==
                want_shuffle(k, t % 32, c.width, c.src, c.delta, c.lane_mask));
      }
  }
}

TEST_CASE("votes over partial masks see only the named lanes", "[emulator]") {
  std::vector<unsigned> out(4 * 64);
  REQUIRE(MOD_EMU_LAUNCH(partial_votes, dim3(1), dim3(64), 0, out.data()).ok());
  unsigned low = 0, high = 0;
  for (unsigned l = 0; l < 32; l += 3) (l < 16 ? low : high) |= 1u << l;
  for (unsigned t = 0; t < 64; ++t) {
    const unsigned* o = &out[4 * t];
    if (t % 32 < 16) {
      REQUIRE(o[0] == low);
      REQUIRE(o[1] == 1);
      REQUIRE(o[2] == 1);
      REQUIRE(o[3] == 0);
    } else {
      REQUIRE(o[0] == high);
      REQUIRE(o[1] == 0);
      REQUIRE(o[2] == 1);
      REQUIRE(o[3] == 1);
    }
  }
}

TEST_CASE("__activemask names the lanes that reach it together", "[emulator]") {
  std::vector<unsigned> out(2 * 40, 0);
  REQUIRE(MOD_EMU_LAUNCH(active_masks, dim3(1), dim3(40), 0, out.data()).ok());
  for (unsigned t = 0; t < 40; ++t) {
    REQUIRE(out[t] == (t < 32 ? 0xffffffffu : 0xffu));  // warp 1 has 8 lanes
    if (t % 2) REQUIRE(out[40 + t] == (t < 32 ? 0xaaaaaaaau : 0xaau));
  }
}

TEST_CASE("__syncwarp orders shared memory within its mask", "[emulator]") {
  std::vector<int> out(16);
  emu::Options random;
  random.random_schedule = true;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    random.seed = seed;
    REQUIRE(emu::launch(emu::LaunchConfig{dim3(1), dim3(32), 0, "syncwarp_exchange", &random},
                        syncwarp_exchange, out.data())
                .ok());
    for (int l = 0; l < 16; ++l)
      REQUIRE(out[static_cast<size_t>(l)] == (l + 1) % 16 * ((l + 1) % 16));
  }
}
