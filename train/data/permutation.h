// A seeded pseudo-random permutation of [0, n) computed on demand: a balanced Feistel network on
// the smallest even number of bits that covers n, cycle-walked back into [0, n). It holds two
// integers, so shuffling billions of windows per epoch costs no memory, and element i needs no
// other element (a data-parallel rank computes only its own rows).
#pragma once

#include <cstdint>

namespace mod::data {

class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t size() const { return n_; }
  // The image of i in [0, n); i -> (*this)(i) is a bijection of [0, n).
  uint64_t operator()(uint64_t i) const;

 private:
  uint64_t encrypt(uint64_t x) const;
  uint64_t n_, key_;
  int half_bits_;
};

}  // namespace mod::data
