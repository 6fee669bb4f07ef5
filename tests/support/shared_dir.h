// Helpers for tests that run under mpirun: a run directory every rank shares, and a group of one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "tests/support/tiny_runs.h"

namespace mod::test {

// Rank 0's temporary directory, the same name on every rank of `comm` (a collective checkpoint's
// run directory must be shared).
inline std::string shared_dir(const std::string& tag,
                              parallel::Communicator& comm = parallel::world()) {
  const std::string dir = temp_dir(tag);
  Tensor chars = Tensor::zeros({256}, DType::I32);
  for (size_t i = 0; i < dir.size() && i < 255; ++i) chars.data<int32_t>()[i] = dir[i];
  comm.broadcast(chars, 0);
  std::string out;
  for (int i = 0; i < 256 && chars.data<int32_t>()[i] != 0; ++i)
    out += static_cast<char>(chars.data<int32_t>()[i]);
  return out;
}

// One process per rank: a group of this rank alone.
inline parallel::Communicator& self_group() {
  static std::unique_ptr<parallel::Communicator> c =
      parallel::world().split(parallel::world().rank(), 0, "self");
  return *c;
}

}  // namespace mod::test
