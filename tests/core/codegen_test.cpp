// The build's own flags against a copy GCC 12.2 miscompiles with AVX-512 (-march=native on a
// cooperlake CPU stored the constant {1, 1, 1, 0} as four 1s; Tensor::from_indices of such a
// list came out wrong). CMakeLists.txt probes for it and adds -mno-avx512f; this case fails if
// that guard is removed on an affected machine.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace {
__attribute__((noinline)) int64_t* allocate(int n) { return new int64_t[n]; }
}  // namespace

TEST_CASE("constant vectors are copied exactly under the build's code generation", "[forward]") {
  for (const std::vector<int64_t>& want :
       {std::vector<int64_t>{1, 1, 1, 0}, std::vector<int64_t>{2, 2, 2, 0}}) {
    int64_t* got = allocate(4);
    for (int i = 0; i < 4; ++i) got[i] = want[i];
    CHECK(std::vector<int64_t>(got, got + 4) == want);
    delete[] got;
  }
  const mod::Tensor t = mod::Tensor::from_indices({1, 1, 1, 0}, {4});
  CHECK(t.at(3) == 0.0);
}
