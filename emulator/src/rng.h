// The seeded randomness of the checking modes: SplitMix64 draws, and a permutation of block
// indices (a Feistel network with cycle walking) that needs no memory for any grid size. The
// same seed gives the same schedule on every machine.
#pragma once

#include <cstdint>

namespace emu::detail {

__extension__ typedef unsigned __int128 Uint128;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next() { return mix64(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n) for n >= 1 (Lemire's multiply; the bias is below 2^-32 for our n).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<Uint128>(next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t seed) : n_(n) {
    while ((uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
    Rng rng(seed);
    for (uint64_t& k : keys_) k = rng.next();
  }
  // The i-th element of a permutation of [0, n).
  uint64_t at(uint64_t i) const {
    uint64_t x = i;
    do x = round_trip(x);
    while (x >= n_);
    return x;
  }

 private:
  uint64_t round_trip(uint64_t x) const {
    const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
    uint64_t left = x >> half_bits_, right = x & mask;
    for (uint64_t k : keys_) {
      const uint64_t next = left ^ (mix64(right ^ k) & mask);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  int half_bits_ = 0;
  uint64_t keys_[4] = {};
};

}  // namespace emu::detail
