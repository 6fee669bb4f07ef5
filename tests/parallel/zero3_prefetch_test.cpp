// ZeRO-3's prefetch (parallel/zero3.h), on the model and its units alone, over a counting dp
// group whose timeline logs each all-gather as it is issued and as its wait returns, beside
// marks the hooks leave as each block starts and ends:
// - forward: block b + 1's all-gather is issued after block b is entered and still in flight
//   when block b's compute ends; backward: block b - 1's is issued once block b's backward is
//   reached and still in flight when block b - 1's is. Never more than two blocks whole or in
//   flight at once.
// - Loss and every gradient bitwise equal to the same units without prefetch.
// - Nothing stays gathered or in flight after a forward without gradients (top-C and causal).
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/random.h"
#include "model/transformer.h"
#include "parallel/counting_communicator.h"
#include "parallel/world.h"
#include "parallel/zero3.h"
#include "tests/support/tiny_runs.h"

using namespace mod;
using parallel::Collective;
using parallel::TimelineEvent;

namespace {

// The units as parallelize builds them: 0 the outer one, 1 + b block b.
std::vector<std::vector<Tensor>> units_of(const model::Transformer& m) {
  std::vector<std::vector<Tensor>> units(1 + m.num_blocks());
  for (const auto& [name, t] : m.named_parameters())
    units[name.rfind("blocks.", 0) == 0 ? 1 + std::stoi(name.substr(7)) : 0].push_back(t);
  return units;
}

size_t blocks_held(const parallel::ShardedUnits& su) {
  size_t n = 0;
  for (size_t u = 1; u < su.size(); ++u) n += su.gathered(u) || su.in_flight(u);
  return n;
}

// The model's hooks, with a mark as each block is entered and left in forward and as its
// backward is reached (an identity node before the units' gather node, so it runs first).
model::UnitHooks marked(parallel::ShardedUnits& su, parallel::CountingCommunicator& dp,
                        size_t& most_held) {
  const model::UnitHooks inner = su.hooks();
  model::UnitHooks h = inner;
  h.enter_block = [inner, &dp, &su, &most_held](size_t b) {
    dp.mark("forward enters " + std::to_string(b));
    inner.enter_block(b);
    most_held = std::max(most_held, blocks_held(su));
  };
  h.leave_block = [inner, &dp, &su, &most_held](size_t b, const Tensor& x, const Tensor& aux) {
    most_held = std::max(most_held, blocks_held(su));
    dp.mark("forward ends " + std::to_string(b));
    auto [x2, aux2] = inner.leave_block(b, x, aux);
    return parallel::gather_unit_for_backward(x2, aux2, [&dp, &su, &most_held, b] {
      most_held = std::max(most_held, blocks_held(su));
      dp.mark("backward reaches " + std::to_string(b));
    });
  };
  return h;
}

struct Step {
  std::vector<TimelineEvent> timeline;
  double loss = 0;
  std::vector<Tensor> grads;
  size_t most_held = 0;
};

Tensor random_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> v(static_cast<size_t>(b * t));
  for (auto& x : v) x = rng.below(vocab);
  return Tensor::from_indices(v, {b, t});
}

// One forward and backward of `recipe`'s model over ZeRO-3 units on the world, timed.
Step step(const std::string& recipe, bool prefetch) {
  const modtrain::RunConfig cfg = test::tiny_recipe(recipe, 1, "");
  model::Transformer m(cfg.model(), 11);
  parallel::CountingCommunicator dp(parallel::world());
  parallel::ShardedUnits su(units_of(m), dp, prefetch);
  Step out;
  m.set_unit_hooks(marked(su, dp, out.most_held));
  const int64_t vocab = cfg.model().vocab_size(), seed = 100 + parallel::world().rank();
  const Tensor tokens = random_tokens(2, 64, vocab, seed), targets = random_tokens(2, 64, vocab, seed + 7);
  dp.record_timeline(true);
  const model::ForwardResult r = m.forward(tokens, targets);
  // Each gradient made, before the units see it: a block's backward has begun (after its gather).
  const LeafGradReady release = su.release_hook();
  backward(r.loss, Tensor(), [&](const Tensor& leaf) {
    out.most_held = std::max(out.most_held, blocks_held(su));
    release(leaf);
  });
  dp.record_timeline(false);
  out.timeline = dp.timeline();
  out.loss = r.loss.item();
  su.release_all();
  for (const auto& [name, p] : m.named_parameters()) out.grads.push_back(p.grad());
  return out;
}

// All-gathers issued and waited before the mark `label`.
struct Counts {
  int issued = 0, waited = 0;
};
Counts before_mark(const std::vector<TimelineEvent>& tl, const std::string& label) {
  Counts c;
  for (const TimelineEvent& e : tl) {
    if (e.kind == TimelineEvent::Mark && e.label == label) return c;
    if (e.collective != Collective::AllGatherAsync) continue;
    (e.kind == TimelineEvent::Issued ? c.issued : c.waited)++;
  }
  FAIL("no mark '" << label << "' in the timeline");
  return c;
}

}  // namespace

TEST_CASE("ZeRO-3 prefetch: the next block's all-gather is in flight while a block computes",
          "[mpi][zero3]") {
  for (const char* recipe : {"tiny_dense", "tiny_mod"}) {
    INFO(recipe);
    const Step s = step(recipe, true);
    const int blocks = static_cast<int>(test::tiny_recipe(recipe, 1, "").model().n_layers());
    // Forward gathers units 0, 1, ..., blocks in order (block 0 prefetched by begin_forward).
    for (int b = 0; b + 1 < blocks; ++b) {
      INFO("forward, block " << b);
      const Counts enter = before_mark(s.timeline, "forward enters " + std::to_string(b));
      const Counts end = before_mark(s.timeline, "forward ends " + std::to_string(b));
      CHECK(enter.issued == b + 2);  // the outer unit and blocks 0..b
      CHECK(end.issued == b + 3);    // block b + 1 too ...
      CHECK(end.waited == b + 2);    // ... and still in flight
    }
    // Backward gathers blocks - 1, ..., 0; forward issued and waited 1 + blocks.
    const int f = 1 + blocks;
    for (int b = blocks - 2; b >= 0; --b) {
      INFO("backward, block " << b << " reached");
      const Counts reach = before_mark(s.timeline, "backward reaches " + std::to_string(b));
      CHECK(reach.issued == f + blocks - b);      // blocks - 1 .. b: issued during b + 1's
      CHECK(reach.waited == f + blocks - 1 - b);  // block b not waited yet
    }
    CHECK(s.most_held <= 2);
  }
}

TEST_CASE("ZeRO-3 prefetch changes no bit of the loss or gradients", "[mpi][zero3]") {
  for (const char* recipe : {"tiny_dense", "tiny_mod"}) {
    INFO(recipe);
    const Step with = step(recipe, true), without = step(recipe, false);
    CHECK(with.loss == without.loss);
    REQUIRE(with.grads.size() == without.grads.size());
    for (size_t i = 0; i < with.grads.size(); ++i) {
      INFO("gradient " << i);
      REQUIRE(with.grads[i].defined());
      REQUIRE(with.grads[i].nbytes() == without.grads[i].nbytes());
      CHECK(std::memcmp(with.grads[i].raw_data(), without.grads[i].raw_data(),
                        with.grads[i].nbytes()) == 0);
    }
    CHECK(without.most_held <= 1);
  }
}

TEST_CASE("ZeRO-3 prefetch leaves nothing gathered or in flight after a forward without gradients",
          "[mpi][zero3]") {
  const modtrain::RunConfig cfg = test::tiny_recipe("tiny_mod", 1, "");
  model::Transformer m(cfg.model(), 11);
  parallel::ShardedUnits su(units_of(m), parallel::world());
  m.set_unit_hooks(su.hooks());
  const Tensor tokens = random_tokens(2, 32, cfg.model().vocab_size(), 5);
  NoGradGuard no_grad;
  for (model::RoutingMode mode : {model::RoutingMode::TopC, model::RoutingMode::Causal}) {
    m.forward(tokens, Tensor(), mode);
    for (size_t u = 0; u < su.size(); ++u) {
      INFO("unit " << u);
      CHECK(!su.gathered(u));
      CHECK(!su.in_flight(u));
    }
  }
}
