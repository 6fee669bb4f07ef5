// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, one pure function of (key, counter), compiled for the host and for
// CUDA kernels alike. Decoding draws the uniform for (sequence, position) from it, so a token's
// draw depends on --seed, its sequence and its position only: not on the batch around it, on the
// thread that computes it, or on how many draws came before.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define MOD_HOST_DEVICE __host__ __device__
#else
#define MOD_HOST_DEVICE
#endif

namespace mod {

struct Philox4x32 {
  uint32_t v[4];
};

MOD_HOST_DEVICE inline uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32 on counter c under key (k0, k1).
MOD_HOST_DEVICE inline Philox4x32 philox4x32(Philox4x32 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(0xD2511F53u, c.v[0], &hi0);
    const uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c.v[2], &hi1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// A uniform in [0, 1) with 24 random bits (exact in float and double) for draw (a, b) of a
// stream keyed by seed; decoding uses a = sequence index, b = position.
MOD_HOST_DEVICE inline double philox_uniform(uint64_t seed, uint64_t a, uint64_t b) {
  const Philox4x32 c{{static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32),
                      static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32)}};
  const Philox4x32 r =
      philox4x32(c, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<double>(r.v[0] >> 8) * (1.0 / 16777216.0);
}

}  // namespace mod
