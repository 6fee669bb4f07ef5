// Feistel permutation (see permutation.h). Each round is x = (L, R) -> (R, L ^ F(R)), which is
// invertible whatever F is; six rounds of a splitmix-style F mix well enough for data order.
// Cycle-walking: the domain is at most 4n, so fewer than four steps are expected per call.
#include "train/data/permutation.h"

#include <stdexcept>

namespace mod::data {

namespace {
constexpr int kRounds = 6;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n), key_(mix(key)), half_bits_(1) {
  if (n == 0) throw std::invalid_argument("permutation of an empty range");
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

uint64_t Permutation::encrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = mix(key_ + static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull + right) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t i) const {
  if (i >= n_) throw std::out_of_range("permutation: index past the range");
  uint64_t y = encrypt(i);
  while (y >= n_) y = encrypt(y);
  return y;
}

}  // namespace mod::data
