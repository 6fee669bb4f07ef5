// Batched decoding (Transformer::decode_batch_step, model/sampler.h) against the single-sequence
// decode_step, whose routing decisions are read on the host: the same greedy tokens and admitted
// counts for 200 tokens (dense, MoD with a predictor, MoD with AUX_BCE; on the CPU, the emulated
// device eagerly and the emulated device graphed); sequence i of a ragged batch equals its prompt
// alone; seeded sampling repeats; and a token a routed block turns away writes nothing to that
// block's cache.
#include <algorithm>
#include <cmath>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "model/sampler.h"
#include "model/transformer.h"
#include "tests/support/emulated_cuda.h"
#include "tests/support/tiny_configs.h"

using namespace mod;
using namespace mod::model;

namespace {
enum class Kind { Dense, Predictor, AuxBce };

modtrain::ModelConfig decode_model(Kind kind) {
  auto cfg = test::tiny_model(kind != Kind::Dense);
  cfg.set_seq_len(256);
  if (kind == Kind::AuxBce)
    cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::AUX_BCE);
  return cfg;
}

const char* kind_name(Kind k) {
  return k == Kind::Dense ? "dense" : k == Kind::Predictor ? "MoD predictor" : "MoD aux-BCE";
}

// The single-sequence reference: decode_step per token, greedy on the host (the lowest id among
// the largest logits).
Generation reference_greedy(const Transformer& m, const std::vector<int64_t>& prompt,
                            int64_t max_new) {
  const int64_t len = static_cast<int64_t>(prompt.size()) + max_new;
  auto caches = m.make_caches(len);
  Generation g;
  Tensor logits;
  int64_t pos = 0;
  for (int64_t tok : prompt) logits = m.decode_step(tok, pos++, caches);
  while (true) {
    const std::vector<double> l = logits.to_vector();
    g.tokens.push_back(std::max_element(l.begin(), l.end()) - l.begin());
    if (static_cast<int64_t>(g.tokens.size()) == max_new) break;
    logits = m.decode_step(g.tokens.back(), pos++, caches);
  }
  for (size_t b = 0; b < caches.size(); ++b)
    if (m.routed(b)) g.admitted.push_back(caches[b].size());
  return g;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

SamplingParams seeded() {
  SamplingParams p;
  p.temperature = 0.9;
  p.top_k = 20;
  p.top_p = 0.9;
  p.seed = 77;
  return p;
}
}  // namespace

TEST_CASE("batched greedy decoding equals decode_step's for 200 tokens, admitted counts too",
          "[mod][decode]") {
  test::EmulatedCudaBackend& emulated = test::emulate_cuda();
  for (Kind kind : {Kind::Dense, Kind::Predictor, Kind::AuxBce}) {
    INFO(kind_name(kind));
    const auto cfg = decode_model(kind);
    Transformer cpu(cfg, 21), device(cfg, 21);
    device.to(Device::CUDA);
    const std::vector<int64_t> prompt = {3, 14, 15, 9, 2};
    const Generation want = reference_greedy(cpu, prompt, 200);
    if (kind != Kind::Dense) {  // the test means something only if routing varies
      INFO("admitted " << want.admitted[0] << " of 204");
      CHECK(want.admitted[0] >= 5);
      CHECK(want.admitted[0] <= 199);
    }
    const Generation got = generate(cpu, prompt, 200, greedy());
    CHECK(got.tokens == want.tokens);
    CHECK(got.admitted == want.admitted);
    for (bool graph : {false, true}) {
      INFO("emulated device, graph " << graph);
      SamplingParams p = greedy();
      p.cuda_graph = graph;
      const int captures = emulated.captures();
      const int64_t ran = emulated.bodies_run(), skipped = emulated.bodies_skipped();
      const Generation dev = generate(device, prompt, 200, p);
      CHECK(emulated.captures() == captures + (graph ? 1 : 0));
      CHECK(dev.tokens == got.tokens);  // the CPU's kernels: bitwise the CPU's run
      CHECK(dev.admitted == got.admitted);
      // Graphed, a routed block's work runs only at the steps where the token enters: the
      // replays (every step, prompt included, but the eager first) skip the rest, which
      // leaves the tokens and the caches as the masked updates would.
      const int64_t routed = kind == Kind::Dense ? 0 : 1;  // tiny_model: one routed block
      const int64_t replays = static_cast<int64_t>(prompt.size()) + 200 - 2;
      CHECK(emulated.bodies_run() + emulated.bodies_skipped() - ran - skipped ==
            (graph ? routed * replays : 0));
      if (graph && routed) {
        CHECK(emulated.bodies_skipped() - skipped > 0);
        CHECK(emulated.bodies_run() - ran > 0);
      }
    }
  }
}

TEST_CASE("sequence i of a ragged batch equals its prompt decoded alone, greedy and seeded",
          "[mod][decode]") {
  test::emulate_cuda();
  const std::vector<std::vector<int64_t>> prompts = {{5}, {1, 2, 3, 4, 5, 6, 7}, {9, 9, 30}};
  for (Kind kind : {Kind::Dense, Kind::Predictor, Kind::AuxBce})
    for (bool device : {false, true}) {
      Transformer m(decode_model(kind), 23);
      if (device) m.to(Device::CUDA);
      for (const SamplingParams& p : {greedy(), seeded()}) {
        INFO(kind_name(kind) << ", device " << device << ", temperature " << p.temperature);
        const auto batch = generate_batch(m, prompts, 40, p);
        REQUIRE(batch.size() == prompts.size());
        for (size_t i = 0; i < prompts.size(); ++i) {
          INFO("sequence " << i);
          SamplingParams alone = p;
          alone.first_stream = i;
          const Generation one = generate(m, prompts[i], 40, alone);
          CHECK(batch[i].tokens.size() == 40);
          CHECK(batch[i].tokens == one.tokens);
          CHECK(batch[i].admitted == one.admitted);
          CHECK(batch[i].seen == one.seen);
        }
        // Run to run: the same draws.
        const auto again = generate_batch(m, prompts, 40, p);
        for (size_t i = 0; i < prompts.size(); ++i) CHECK(again[i].tokens == batch[i].tokens);
      }
    }
}

TEST_CASE("copies of one prompt draw from their own streams, and another seed draws otherwise",
          "[mod][decode]") {
  Transformer m(decode_model(Kind::Predictor), 24);
  const std::vector<std::vector<int64_t>> copies(4, std::vector<int64_t>{7, 8});
  const auto a = generate_batch(m, copies, 30, seeded());
  CHECK(a[0].tokens != a[1].tokens);
  CHECK(a[1].tokens != a[2].tokens);
  SamplingParams other = seeded();
  other.seed = 78;
  CHECK(generate_batch(m, copies, 30, other)[0].tokens != a[0].tokens);
  // Greedy copies are identical.
  const auto g = generate_batch(m, copies, 30, greedy());
  for (const auto& s : g) CHECK(s.tokens == g[0].tokens);
}

TEST_CASE("a token a routed block turns away writes nothing to its cache", "[mod][decode]") {
  const auto cfg = decode_model(Kind::Predictor);
  Transformer m(cfg, 25);
  const int64_t length = 40;
  DecodeState s = m.make_decode_state({{1, 2, 3}, {4}}, {30, 20}, length, -1);
  SampleArgs args;
  args.temperature = 0;
  REQUIRE(m.routed(1));
  const KvCache& c = s.caches[1];
  const int64_t w = c.k.numel() / (2 * length);  // H * Dh
  int turned_away = 0, admitted = 0;
  for (int step = 0; step < 30; ++step) {
    const Tensor k0 = c.k.clone(), v0 = c.v.clone(), len0 = c.len.clone();
    const Tensor active0 = s.active.clone();
    m.decode_batch_step(s, args);
    for (int64_t b = 0; b < 2; ++b) {
      INFO("step " << step << ", sequence " << b);
      const bool in = c.admit.data<int64_t>()[b] != 0;
      const int64_t n0 = len0.data<int64_t>()[b], n = c.len.data<int64_t>()[b];
      CHECK(n == n0 + (in ? 1 : 0));
      if (in) CHECK(active0.data<int64_t>()[b] == 1);
      turned_away += !in && active0.data<int64_t>()[b] == 1;
      admitted += in;
      // Every slot but the one an admitted token filled keeps its contents.
      for (int64_t slot = 0; slot < length; ++slot) {
        if (in && slot == n0) continue;
        const int64_t at = (b * length + slot) * w;
        for (int64_t i = at; i < at + w; ++i) {
          REQUIRE(c.k.data<float>()[i] == k0.data<float>()[i]);
          REQUIRE(c.v.data<float>()[i] == v0.data<float>()[i]);
        }
      }
      // Slots past the length were never written.
      for (int64_t i = (b * length + n) * w; i < (b + 1) * length * w; ++i)
        REQUIRE(c.k.data<float>()[i] == 0);
    }
  }
  INFO("admitted " << admitted << ", turned away " << turned_away);
  CHECK(admitted > 0);
  CHECK(turned_away > 0);
  // Sequence 1 stops at position 20: it fed 20 tokens, and the dense block cached each.
  CHECK(s.caches[0].len.data<int64_t>()[1] == 20);
  CHECK(s.caches[0].len.data<int64_t>()[0] == 30);
  CHECK(s.active.data<int64_t>()[0] == 0);
  CHECK(s.active.data<int64_t>()[1] == 0);
}

TEST_CASE("a generated end-of-text token ends its sequence", "[mod][decode]") {
  Transformer m(decode_model(Kind::Predictor), 26);
  const Generation free = generate(m, {3, 4}, 50, greedy());
  REQUIRE(free.tokens.size() == 50);
  SamplingParams p = greedy();
  p.eot = free.tokens[10];
  const size_t first = std::find(free.tokens.begin(), free.tokens.end(), p.eot) - free.tokens.begin();
  const Generation cut = generate(m, {3, 4}, 50, p);
  CHECK(cut.tokens == std::vector<int64_t>(free.tokens.begin(), free.tokens.begin() + first));
  CHECK(cut.seen[0] == static_cast<int64_t>(2 + first));
}

// Weights holding NaN (opened with --allow-non-finite) used to sample "In the beginninggggg"
// greedily, or fail at the embedding naming id -1 with a temperature. The step whose logits are
// non-finite stops its sequence on the device; the host names it with the tokens at the end.
TEST_CASE("non-finite logits stop sampling, naming the sequence and the new token",
          "[mod][decode]") {
  Transformer m(decode_model(Kind::Predictor), 28);
  m.parameter("final_norm.weight").data<float>()[0] = std::nanf("");
  for (const double temperature : {0.0, 0.8}) {
    INFO("temperature " << temperature);
    SamplingParams p = greedy();
    p.temperature = temperature;
    CHECK_THROWS_WITH(generate_batch(m, {{3, 4}, {5}}, 6, p),
                      Catch::Contains("sequence 0 held a NaN or an infinity at new token 1 "
                                      "(position 2)"));
  }
}

TEST_CASE("batched decoding refuses empty, too long and mismatched prompts", "[mod][decode]") {
  Transformer m(decode_model(Kind::Predictor), 27);
  CHECK_THROWS_WITH(generate_batch(m, {}, 4, greedy()), Catch::Contains("no prompts"));
  CHECK_THROWS_WITH(generate_batch(m, {{1}, {}}, 4, greedy()), Catch::Contains("prompt is empty"));
  CHECK_THROWS_WITH(generate(m, std::vector<int64_t>(256, 1), 4, greedy()),
                    Catch::Contains("leaves no room in model.seq_len 256"));
  CHECK_THROWS_WITH(generate(m, {1}, 0, greedy()), Catch::Contains("at least 1"));
  CHECK_THROWS_WITH(m.make_decode_state({{1, 2}}, {5, 6}, 10, -1), Catch::Contains("one each"));
  CHECK_THROWS_WITH(m.make_decode_state({{1, 2}}, {10}, 10, -1), Catch::Contains("stop < 10"));
}
