// The window loader: reproducible order, targets shifted by one, rows independent of how the
// batch is split across data-parallel ranks, and exact resume from a saved state.
#include "train/data/loader.h"

#include <catch2/catch.hpp>
#include <numeric>

using namespace mod;
using namespace mod::data;

namespace {
std::shared_ptr<std::vector<uint32_t>> ramp(size_t n) {
  auto t = std::make_shared<std::vector<uint32_t>>(n);
  std::iota(t->begin(), t->end(), 0u);
  return t;
}
}  // namespace

TEST_CASE("windows are reproducible and targets are inputs shifted by one", "[data]") {
  auto tokens = ramp(5000);
  WindowLoader a(tokens, 16, 4, 7), b(tokens, 16, 4, 7), c(tokens, 16, 4, 8);
  Batch x = a.next(), y = b.next(), z = c.next();
  CHECK(x.inputs.to_vector() == y.inputs.to_vector());
  CHECK(x.inputs.to_vector() != z.inputs.to_vector());
  for (int64_t r = 0; r < 4; ++r) {
    const double start = x.inputs.at(r * 16);
    for (int64_t t = 0; t < 16; ++t) {
      CHECK(x.inputs.at(r * 16 + t) == start + t);
      CHECK(x.targets.at(r * 16 + t) == start + t + 1);
    }
  }
  CHECK(a.next().inputs.to_vector() != x.inputs.to_vector());
}

TEST_CASE("a DP rank's slice equals the same rows of the whole batch", "[data]") {
  auto tokens = ramp(10000);
  WindowLoader whole(tokens, 8, 6, 3), rank0(tokens, 8, 6, 3), rank1(tokens, 8, 6, 3);
  for (int step = 0; step < 3; ++step) {
    auto all = whole.next().inputs.to_vector();
    auto lo = rank0.next(0, 3).inputs.to_vector();
    auto hi = rank1.next(3, 6).inputs.to_vector();
    lo.insert(lo.end(), hi.begin(), hi.end());
    CHECK(lo == all);
  }
}

TEST_CASE("restoring a saved state continues the same sequence", "[data]") {
  auto tokens = ramp(10000);
  WindowLoader run(tokens, 8, 2, 11);
  run.next();
  run.next();
  const LoaderState saved = run.state();
  CHECK(saved.batches_drawn == 2);
  auto expected = run.next().inputs.to_vector();
  WindowLoader resumed(tokens, 8, 2, 11);
  resumed.restore(saved);
  CHECK(resumed.next().inputs.to_vector() == expected);
}

TEST_CASE("sequential validation batches tile the tokens in order", "[data]") {
  std::vector<uint32_t> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 0u);
  auto batches = sequential_batches(tokens, 10, 3, 100);
  REQUIRE(batches.size() == 3);  // 9 full windows of 10 (+1 target) in 100 tokens
  CHECK(batches[1].inputs.at(0) == 30);
  CHECK(batches[2].targets.at(3 * 10 - 1) == 90);
}
