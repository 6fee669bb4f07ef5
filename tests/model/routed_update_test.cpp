// routed_update (model/block.h), the one place MoD's x + g(r) * f is computed for top-C
// training, causal evaluation and one-token decoding: the chosen rows get g(r) times the
// block's delta at their original positions, the others pass unchanged, and the decoding form
// (one row with a KV cache) gives what the whole sub-sequence gives.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/all_ops.h"
#include "core/autograd.h"
#include "model/block.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::model;

namespace {
// idx [2,4]: rows spread over each sequence of 12, none at 0 in the first.
Tensor spread_rows() {
  return Tensor::from_indices({1, 4, 5, 9, 0, 2, 3, 11}, {2, 4});
}
}  // namespace

TEST_CASE("routed_update adds g(r) * f to the chosen rows only, at their original positions",
          "[mod]") {
  const auto cfg = test::tiny_model(true);
  Rng rng(21);
  Block block(cfg, /*routed=*/true, rng, DType::F64);
  const Tensor x = randn({2, 12, 16}, rng, DType::F64), r = randn({2, 12}, rng, DType::F64);
  const Tensor idx = spread_rows();
  NoGradGuard no_grad;
  const Tensor f = block.delta(gather_rows(x, idx), idx);  // [2,4,16] at the true positions
  for (RoutingMode mode : {RoutingMode::TopC, RoutingMode::Causal}) {
    INFO((mode == RoutingMode::TopC ? "top-C" : "causal"));
    const Tensor out = routed_update(block, x, test::arange_positions(2, 12), r, idx,
                                     modtrain::RouterConfig::SIGMOID, mode);
    REQUIRE(out.shape() == x.shape());
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<int64_t> slot(12, -1);  // row t's place in idx, -1: not routed
      for (int64_t c = 0; c < 4; ++c) slot[static_cast<int64_t>(idx.at(b * 4 + c))] = c;
      for (int64_t t = 0; t < 12; ++t) {
        const double g = 1.0 / (1.0 + std::exp(-r.at(b * 12 + t)));
        for (int64_t d = 0; d < 16; ++d) {
          const int64_t at = (b * 12 + t) * 16 + d;
          if (slot[t] < 0)
            CHECK(out.at(at) == x.at(at));  // bitwise: an unrouted row is never touched
          else
            CHECK(out.at(at) ==
                  Approx(x.at(at) + g * f.at((b * 4 + slot[t]) * 16 + d)).margin(1e-12));
        }
      }
    }
  }
}

TEST_CASE("routed_update one row at a time through a KV cache equals the whole sub-sequence",
          "[mod]") {
  const auto cfg = test::tiny_model(true);
  Rng rng(22);
  Block block(cfg, /*routed=*/true, rng, DType::F64);
  const Tensor x = randn({1, 12, 16}, rng, DType::F64), r = randn({1, 12}, rng, DType::F64);
  const std::vector<int64_t> chosen = {0, 3, 4, 8, 11};
  const Tensor idx = Tensor::from_indices(chosen, {1, 5});
  NoGradGuard no_grad;
  const Tensor whole = routed_update(block, x, test::arange_positions(1, 12), r, idx,
                                     modtrain::RouterConfig::SIGMOID, RoutingMode::Causal);
  KvCache cache;
  cache.k = Tensor::zeros({12, 2, 8}, DType::F64);
  cache.v = Tensor::zeros({12, 2, 8}, DType::F64);
  const Tensor row = Tensor::from_indices({0}, {1, 1});
  for (int64_t t : chosen) {
    INFO("position " << t);
    const Tensor x_t = x.view({12, 16}).narrow0(t, 1).view({1, 1, 16});
    const Tensor r_t = r.view({12}).narrow0(t, 1).view({1, 1});
    const Tensor one = routed_update(block, x_t, Tensor::from_indices({t}, {1, 1}), r_t, row,
                                     modtrain::RouterConfig::SIGMOID, RoutingMode::Causal, &cache);
    for (int64_t d = 0; d < 16; ++d) CHECK(one.at(d) == Approx(whole.at(t * 16 + d)).margin(1e-12));
  }
  CHECK(cache.size() == 5);  // the cache holds exactly the routed tokens
}
