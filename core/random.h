// Counter-free, seedable random numbers (xoshiro256**) for initialisation, data order and tests.
// The whole state is four words, so checkpoints can store it exactly.
#pragma once

#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace mod {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x5eed);
  uint64_t next_u64();
  double uniform();                  // [0, 1)
  double normal();                   // standard normal (Box-Muller)
  int64_t below(int64_t n);          // uniform in [0, n)
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_;
};

// CPU tensors filled from rng: normal(mean, std) or uniform[lo, hi).
Tensor randn(const Shape& shape, Rng& rng, DType dtype = DType::F32, double std = 1.0,
             double mean = 0.0);
Tensor rand_uniform(const Shape& shape, Rng& rng, DType dtype = DType::F32, double lo = 0.0,
                    double hi = 1.0);

}  // namespace mod
