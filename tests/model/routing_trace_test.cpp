// The routing trace behind `modtrain inspect`: both routings of one sequence, block by block,
// checked against what the model's own forwards decide.
#include "model/routing_trace.h"

#include <catch2/catch.hpp>

#include "core/autograd.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::model;

namespace {
std::vector<int64_t> sequence(int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = (i * 11 + 5) % 32;
  return ids;
}
}  // namespace

TEST_CASE("a routing trace holds each routed block's scores and both routings", "[mod]") {
  auto cfg = test::tiny_model(true);
  cfg.set_n_layers(4);  // blocks 1 and 3 routed
  Transformer m(cfg, 61, DType::F64);
  const auto ids = sequence(12);
  const RoutingTrace trace = trace_routing(m, ids);
  CHECK(trace.tokens == ids);
  CHECK(trace.capacity == 3);
  REQUIRE(trace.blocks.size() == 2);
  CHECK(trace.blocks[0].block == 1);
  CHECK(trace.blocks[1].block == 3);

  NoGradGuard g;
  const Tensor tokens = Tensor::from_indices(ids, {1, 12});
  const auto top = m.forward(tokens, Tensor(), RoutingMode::TopC);
  for (size_t k = 0; k < 2; ++k) {
    const BlockTrace& b = trace.blocks[k];
    INFO("block " << b.block);
    CHECK(b.router_score == top.stats[k].r.to_vector());
    int64_t chosen = 0, agree = 0;
    std::vector<bool> want(12, false);
    for (double i : top.routed_idx[k].to_vector()) want[static_cast<size_t>(i)] = true;
    CHECK(b.top_c == want);
    for (int64_t i = 0; i < 12; ++i) {
      chosen += b.top_c[i];
      agree += b.top_c[i] == b.causal[i];
      CHECK(b.decision_prob[i] > 0.0);
      CHECK(b.decision_prob[i] < 1.0);
    }
    CHECK(chosen == 3);
    CHECK(b.agreement == Approx(agree / 12.0));
  }
  // Block 1 sees the same input in both modes (block 0 is dense), so its causal admissions are
  // exactly the tokens whose predictor says p > 0.5 on the top-C pass.
  const BlockTrace& first = trace.blocks[0];
  for (int64_t i = 0; i < 12; ++i) CHECK(first.causal[i] == (first.decision_prob[i] > 0.5));
  int64_t admitted = 0;
  for (bool a : first.causal) admitted += a;
  CHECK(admitted > 0);  // the check above has both classes to tell apart
  CHECK(admitted < 12);
}

TEST_CASE("a routing trace refuses dense models, NONE and over-long text", "[mod]") {
  using Catch::Matchers::Contains;
  Transformer dense(test::tiny_model(false), 62, DType::F64);
  CHECK_THROWS_WITH(trace_routing(dense, sequence(4)), Contains("model.mod.enabled"));
  auto none = test::tiny_model(true);
  none.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::NONE);
  Transformer no_causal(none, 63, DType::F64);
  CHECK_THROWS_WITH(trace_routing(no_causal, sequence(4)), Contains("causal.method is NONE"));
  Transformer m(test::tiny_model(true), 64, DType::F64);
  CHECK_THROWS_WITH(trace_routing(m, sequence(13)), Contains("model.seq_len 12"));
}

TEST_CASE("routing agreement over a batch equals the traces of its sequences", "[mod]") {
  auto cfg = test::tiny_model(true);
  cfg.set_n_layers(4);
  Transformer m(cfg, 65, DType::F64);
  const Tensor tokens = test::tokens_for(3, 12, 32, 66);
  const auto agreement = routing_agreement(m, tokens);
  REQUIRE(agreement.size() == 2);
  std::vector<double> want(2, 0.0);
  for (int64_t s = 0; s < 3; ++s) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 12; ++i) ids.push_back(static_cast<int64_t>(tokens.at(s * 12 + i)));
    const auto trace = trace_routing(m, ids);
    for (size_t k = 0; k < 2; ++k) want[k] += trace.blocks[k].agreement / 3;
  }
  CHECK(agreement[0] == Approx(want[0]).margin(1e-12));
  CHECK(agreement[1] == Approx(want[1]).margin(1e-12));
  CHECK(agreement[0] < 1.0);  // top-C and causal differ somewhere: the check can tell
}
