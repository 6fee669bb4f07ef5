// The mixture-of-experts layer and MoDE (docs/architecture.md section 3), each property as a test that fails
// when it breaks (the slot selections: moe_selection_test.cpp): forward values against a
// token-by-token computation; finite-difference gradients of the layer, a staged-MoDE block and
// whole models; the two limits of integrated MoDE (all capacity on the no-op expert is the identity,
// none is a plain MoE); causal routing and incremental decoding; FLOPs and parameter counts.
#include "model/moe.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <numbers>

#include "core/all_ops.h"
#include "core/weight_copy.h"
#include "model/flops.h"
#include "model/moe_routing.h"
#include "model/transformer.h"
#include "parallel/adamw.h"
#include "tests/support/grad_check.h"
#include "tests/support/overfit.h"
#include "tests/support/tiny_configs.h"
#include "train/grad_clip.h"
#include "train/lr_schedule.h"

using mod::test::arange_positions;
using mod::test::max_diff;
using mod::test::tokens_for;

using namespace mod;
using namespace mod::model;

namespace {
// Each sequence a random choice of t distinct tokens (t <= vocab). A repeated token at the start
// gives positions with the same hidden state up to rounding, a router tie that rounding decides
// and a finite-difference step may flip.
Tensor distinct_tokens(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < b; ++r) {
    std::vector<int64_t> perm(vocab);
    for (int64_t i = 0; i < vocab; ++i) perm[i] = i;
    for (int64_t i = vocab - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
    ids.insert(ids.end(), perm.begin(), perm.begin() + t);
  }
  return Tensor::from_indices(ids, {b, t});
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::abs(a.at(i)));
  return m;
}


// sum(out * weights) + aux: one scalar that sees every output element and the auxiliary loss.
Tensor objective(const Tensor& out, const Tensor& aux, const Tensor& weights) {
  Tensor s = sum(mul(out, weights));
  return aux.defined() ? add(s, aux) : s;
}

// Runs the finite-difference check and asserts every checked input got a non-zero gradient.
void check_grad_case(const std::string& name, std::function<std::vector<Tensor>(Rng&)> inputs,
                     std::function<Tensor(const std::vector<Tensor>&)> forward) {
  std::vector<Tensor> seen;
  test::GradCase c{name, Op::ScatterAddRows,
                   [&](Rng& r) {
                     seen = inputs(r);
                     return seen;
                   },
                   forward};
  const auto report = test::check_gradients(c, 11);
  INFO(name << ": worst " << report.worst << " (" << report.worst_error << "), "
            << report.elements_checked << " elements");
  CHECK(report.ok);
  CHECK(report.elements_checked > 0);
  for (size_t i = 0; i < seen.size(); ++i) {
    INFO("input " << i);
    REQUIRE(seen[i].grad().defined());
    CHECK(max_abs(seen[i].grad()) > 1e-6);  // a check of zeros against zeros would prove nothing
  }
}

void set_all(Tensor t, double v) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
}
}  // namespace

// --- forward values ---

namespace {
// MoeMlp::forward by hand, token by token: router softmax, the selection, and each taking
// expert's MLP from the stacked weights, weighted by its probability; the auxiliary loss too.
struct ByHand {
  std::vector<double> out;  // [B,T,D]
  double aux = 0;
  int64_t empty_slots = 0;  // token choice: slots no token filled
  double dropped_fraction = 0;
};
ByHand moe_by_hand(const MoeMlp& layer, const modtrain::ModelConfig& cfg, const Tensor& x) {
  const auto& mc = cfg.moe();
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), e_real = mc.n_experts(),
                e_all = e_real + (mc.noop_expert() ? 1 : 0),
                f = mc.d_expert() > 0 ? mc.d_expert() : cfg.d_ff();
  const bool swiglu = cfg.mlp() == modtrain::ModelConfig::SWIGLU;
  const Tensor w = layer.parameter("router.weight"), up = layer.parameter("experts.up"),
               down = layer.parameter("experts.down");
  const Tensor bias = mc.router_bias() ? layer.parameter("router.bias") : Tensor();
  const Tensor gate = swiglu ? layer.parameter("experts.gate") : Tensor();
  std::vector<double> probs(b * t * e_all);
  double z = 0;
  for (int64_t i = 0; i < b * t; ++i) {
    std::vector<double> logit(e_all);
    double mx = -1e300, total = 0;
    for (int64_t e = 0; e < e_all; ++e) {
      logit[e] = bias.defined() ? bias.at(e) : 0.0;
      for (int64_t k = 0; k < d; ++k) logit[e] += w.at(e * d + k) * x.at(i * d + k);
      mx = std::max(mx, logit[e]);
    }
    for (int64_t e = 0; e < e_all; ++e) total += std::exp(logit[e] - mx);
    for (int64_t e = 0; e < e_all; ++e) probs[i * e_all + e] = std::exp(logit[e] - mx) / total;
    const double lse = mx + std::log(total);
    z += lse * lse;
  }
  ByHand r;
  r.aux = mc.z_weight() * z / static_cast<double>(b * t);
  const Tensor p = Tensor::from_vector(probs, {b, t, e_all}, DType::F64);
  const bool tc = mc.routing() == modtrain::MoEConfig::TOKEN_CHOICE;
  const ExpertSlots s = tc ? token_choice(p, mc) : expert_choice(p, mc);
  r.empty_slots = std::count(s.valid.begin(), s.valid.end(), 0);
  r.dropped_fraction = s.dropped_fraction;
  if (tc) {  // Switch balance loss per sequence, averaged over sequences
    double balance = 0;
    for (int64_t r0 = 0; r0 < b; ++r0)
      for (int64_t e = 0; e < e_real; ++e) {
        double mean_p = 0;
        for (int64_t i = 0; i < t; ++i) mean_p += probs[(r0 * t + i) * e_all + e] / t;
        balance += s.first_choice_share[r0 * e_real + e] * mean_p;
      }
    r.aux += mc.balance_weight() * e_real * balance / b;
  }
  auto gelu_tanh = [](double v) {
    const double c = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * v * (1.0 + std::tanh(c * (v + 0.044715 * v * v * v)));
  };
  r.out.assign(b * t * d, 0.0);
  for (int64_t e = 0; e < e_real; ++e)
    for (int64_t r0 = 0; r0 < b; ++r0)
      for (int64_t j = 0; j < s.k; ++j) {
        const int64_t slot = (e * b + r0) * s.k + j;
        if (!s.valid[slot]) continue;
        const int64_t tok = r0 * t + s.token[slot];
        std::vector<double> h(f);
        for (int64_t q = 0; q < f; ++q) {
          double u = 0, g = 0;
          for (int64_t k = 0; k < d; ++k) {
            u += up.at((e * f + q) * d + k) * x.at(tok * d + k);
            if (swiglu) g += gate.at((e * f + q) * d + k) * x.at(tok * d + k);
          }
          h[q] = swiglu ? g / (1.0 + std::exp(-g)) * u : gelu_tanh(u);
        }
        for (int64_t k = 0; k < d; ++k) {
          double y = 0;
          for (int64_t q = 0; q < f; ++q) y += down.at((e * d + k) * f + q) * h[q];
          r.out[tok * d + k] += probs[tok * e_all + e] * y;
        }
      }
  return r;
}
}  // namespace

TEST_CASE("MoeMlp::forward equals a token-by-token computation from the weights", "[moe]") {
  struct Variant {
    const char* name;
    std::function<void(modtrain::MoEConfig&)> edit;
    bool swiglu = false;
  };
  const std::vector<Variant> variants{
      {"expert choice GELU", [](modtrain::MoEConfig&) {}},
      {"expert choice SWIGLU", [](modtrain::MoEConfig&) {}, true},
      {"token choice top 2",
       [](modtrain::MoEConfig& e) {
         e.set_routing(modtrain::MoEConfig::TOKEN_CHOICE);
         e.set_top_k(2);
         e.set_capacity_factor(0.5);
         e.set_balance_weight(0.3);
       }},
      {"token choice top 1",
       [](modtrain::MoEConfig& e) {
         e.set_routing(modtrain::MoEConfig::TOKEN_CHOICE);
         e.set_capacity_factor(1.25);  // K = 4 of 12: some experts overflow, some have room
         e.set_balance_weight(0.3);
       }},
      {"integrated",
       [](modtrain::MoEConfig& e) {
         e.set_noop_expert(true);
         e.set_router_bias(true);
         e.set_noop_capacity(0.25);
       }},
  };
  for (const auto& v : variants) {
    DYNAMIC_SECTION(v.name) {
      auto cfg = test::tiny_moe(false);
      cfg.mutable_moe()->set_z_weight(0.2);
      cfg.mutable_moe()->set_d_expert(24);
      if (v.swiglu) cfg.set_mlp(modtrain::ModelConfig::SWIGLU);
      v.edit(*cfg.mutable_moe());
      Rng rng(71);
      MoeMlp layer(cfg, rng, DType::F64);
      if (cfg.moe().router_bias())
        for (int64_t e = 0; e < 5; ++e) layer.parameter("router.bias").set(e, 0.1 * e - 0.2);
      const Tensor x = randn({3, 12, 16}, rng, DType::F64);
      NoGradGuard g;
      const MoeOutput m = layer.forward(x);
      std::vector<MoeStats> stats = {m.stats};
      resolve_moe_stats(stats);  // the counts stay device tensors until read
      const ByHand want = moe_by_hand(layer, cfg, x);
      if (cfg.moe().routing() == modtrain::MoEConfig::TOKEN_CHOICE) {
        CHECK(want.dropped_fraction > 0);
        CHECK(stats[0].dropped_fraction == want.dropped_fraction);
        if (cfg.moe().top_k() == 1) CHECK(want.empty_slots > 0);  // gate 0 for empty slots
      }
      CHECK(max_diff(m.out, Tensor::from_vector(want.out, {3, 12, 16}, DType::F64)) < 1e-12);
      CHECK(max_abs(m.out) > 1e-3);
      REQUIRE(m.aux.defined());
      CHECK(m.aux.item() == Approx(want.aux).epsilon(1e-12));
    }
  }
}

// --- gradients ---

TEST_CASE("MoeMlp::forward passes finite-difference gradient checks in float64", "[moe][grad]") {
  struct Variant {
    const char* name;
    std::function<void(modtrain::ModelConfig&)> edit;
  };
  const std::vector<Variant> variants{
      {"expert choice GELU", [](modtrain::ModelConfig&) {}},
      {"expert choice SWIGLU",
       [](modtrain::ModelConfig& m) { m.set_mlp(modtrain::ModelConfig::SWIGLU); }},
      {"token choice top 2 + balance",
       [](modtrain::ModelConfig& m) {
         auto* e = m.mutable_moe();
         e->set_routing(modtrain::MoEConfig::TOKEN_CHOICE);
         e->set_top_k(2);
         e->set_capacity_factor(0.5);  // K = 2 of 8 tokens per expert: choices are dropped
         e->set_balance_weight(0.5);
       }},
      {"integrated (no-op expert)",
       [](modtrain::ModelConfig& m) {
         m.mutable_moe()->set_noop_expert(true);
         m.mutable_moe()->set_router_bias(true);
       }},
  };
  for (const auto& v : variants) {
    DYNAMIC_SECTION(v.name) {
      auto cfg = test::tiny_moe(false);
      cfg.set_d_model(8);
      cfg.mutable_moe()->set_d_expert(4);
      cfg.mutable_moe()->set_z_weight(0.1);
      v.edit(cfg);
      Rng rng(21);
      auto layer = std::make_shared<MoeMlp>(cfg, rng, DType::F64);
      const Tensor weights = randn({2, 8, 8}, rng, DType::F64);
      {
        NoGradGuard g;  // the selection actually drops, or routes to the no-op expert
        std::vector<MoeStats> resolved = {layer->forward(randn({2, 8, 8}, rng, DType::F64)).stats};
        resolve_moe_stats(resolved);
        const MoeStats& stats = resolved[0];
        if (cfg.moe().routing() == modtrain::MoEConfig::TOKEN_CHOICE)
          CHECK(stats.dropped_fraction > 0);
        if (cfg.moe().noop_expert()) CHECK(stats.noop_fraction == 0.5);
      }
      const bool swiglu = cfg.mlp() == modtrain::ModelConfig::SWIGLU;
      check_grad_case(
          v.name,
          [&](Rng& r) {
            std::vector<Tensor> in{randn({2, 8, 8}, r, DType::F64).set_requires_grad(true),
                                   layer->parameter("router.weight"),
                                   layer->parameter("experts.up"),
                                   layer->parameter("experts.down")};
            if (swiglu) in.push_back(layer->parameter("experts.gate"));
            if (cfg.moe().router_bias()) in.push_back(layer->parameter("router.bias"));
            return in;
          },
          [&](const std::vector<Tensor>& in) {
            const MoeOutput m = layer->forward(in[0]);
            REQUIRE(m.aux.defined());
            return objective(m.out, m.aux, weights);
          });
    }
  }
}

TEST_CASE("a staged-MoDE block (MoD routing in front of an MoE MLP) passes a gradient check",
          "[moe][grad]") {
  auto cfg = test::tiny_moe(true);
  cfg.set_d_model(8);
  cfg.mutable_moe()->set_d_expert(4);
  cfg.mutable_moe()->set_z_weight(0.1);
  Rng rng(22);
  auto block = std::make_shared<Block>(cfg, /*routed=*/true, rng, DType::F64, /*moe=*/true);
  REQUIRE(block->moe() != nullptr);
  const Tensor pos = arange_positions(2, 8), weights = randn({2, 8, 8}, rng, DType::F64);
  check_grad_case(
      "staged MoDE block [2,8,8] C=4",
      [&](Rng& r) {
        return std::vector<Tensor>{
            randn({2, 8, 8}, r, DType::F64).set_requires_grad(true),
            block->parameter("router.proj.weight"), block->parameter("mlp.router.weight"),
            block->parameter("mlp.experts.up"), block->parameter("attn.wv.weight")};
      },
      [&](const std::vector<Tensor>& in) {
        ForwardResult result;
        auto out = route_top_c(*block, in[0], pos, 4, modtrain::RouterConfig::IDENTITY, &result);
        REQUIRE(result.moe_stats.size() == 1);
        return objective(out.out, result.aux_loss, weights);
      });
}

TEST_CASE("whole integrated and staged MoDE models pass a gradient check of the loss",
          "[moe][grad]") {
  for (bool staged : {false, true}) {
    DYNAMIC_SECTION((staged ? "staged" : "integrated")) {
      auto cfg = test::tiny_moe(staged, /*noop_expert=*/!staged);
      // Not PREDICTOR: its BCE reads a detached x by design, which finite differences would see.
      cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::AUX_BCE);
      cfg.set_vocab_size(16);
      cfg.set_d_model(8);
      cfg.set_d_ff(8);
      cfg.set_seq_len(8);
      cfg.set_init_std(0.5);
      cfg.mutable_moe()->set_n_experts(2);
      cfg.mutable_moe()->set_z_weight(0.1);
      Transformer m(cfg, 23, DType::F64);
      const Tensor tok = distinct_tokens(2, 8, 16, 24), tgt = tokens_for(2, 8, 16, 25);
      check_grad_case(
          staged ? "staged MoDE transformer" : "integrated MoDE transformer",
          [&](Rng&) {
            std::vector<Tensor> in{m.parameter("embed.weight"),
                                   m.parameter("blocks.0.mlp.router.weight"),
                                   m.parameter("blocks.1.mlp.router.weight"),
                                   m.parameter("blocks.1.mlp.experts.down")};
            if (staged) in.push_back(m.parameter("blocks.1.router.proj.weight"));
            return in;
          },
          [&](const std::vector<Tensor>&) {
            auto r = m.forward(tok, tgt);
            REQUIRE(r.moe_stats.size() == 2);
            return r.loss;
          });
    }
  }
}

TEST_CASE("a model's MoE layers report statistics per block and add their loss to the total",
          "[moe]") {
  for (bool staged : {false, true}) {
    DYNAMIC_SECTION((staged ? "staged" : "integrated")) {
      auto cfg = test::tiny_moe(staged, /*noop_expert=*/!staged);
      cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::NONE);
      cfg.mutable_moe()->set_z_weight(0.0);
      Transformer m(cfg, 81, DType::F64);
      const Tensor tok = tokens_for(2, 12, 32, 82);
      NoGradGuard g;
      const auto off = m.forward(tok, tok);
      CHECK_FALSE(off.aux_loss.defined());  // no router BCE, no predictor, z-loss off
      CHECK(off.loss.item() == off.lm_loss.item());
      cfg.mutable_moe()->set_z_weight(0.1);
      Transformer m2(cfg, 81, DType::F64);
      const auto on = m2.forward(tok, tok);
      CHECK(max_diff(on.logits, off.logits) == 0.0);  // same weights, same routing
      REQUIRE(on.aux_loss.defined());
      CHECK(on.aux_loss.item() > 1e-3);  // 0.1 * mean lse^2 per block, lse about log E'
      CHECK(on.loss.item() == Approx(on.lm_loss.item() + on.aux_loss.item()).epsilon(1e-14));
      REQUIRE(on.moe_stats.size() == 2);
      for (int b = 0; b < 2; ++b) {
        CHECK(on.moe_stats[b].block == b);
        CHECK(on.moe_stats[b].noop_fraction == (staged ? 0.0 : 0.5));
      }
    }
  }
}

// --- the two limits of integrated MoDE ---

TEST_CASE("integrated MoDE with all capacity on the no-op expert is the identity", "[moe]") {
  auto cfg = test::tiny_moe(false, /*noop_expert=*/true);
  cfg.mutable_moe()->set_noop_capacity(1.0);
  cfg.mutable_moe()->set_z_weight(0.0);
  SECTION("the layer outputs exactly zero and its experts get no gradient") {
    Rng rng(31);
    MoeMlp layer(cfg, rng, DType::F64);
    Tensor x = randn({2, 12, 16}, rng, DType::F64).set_requires_grad(true);
    const MoeOutput m = layer.forward(x);
    CHECK(max_abs(m.out) == 0.0);
    std::vector<MoeStats> stats = {m.stats};
    resolve_moe_stats(stats);
    CHECK(stats[0].noop_fraction == 1.0);
    CHECK(stats[0].unrouted_fraction == 1.0);
    sum(mul(add(m.out, x), randn({2, 12, 16}, rng, DType::F64))).backward();
    for (const char* name : {"experts.up", "experts.down", "router.weight"}) {
      INFO(name);
      const Tensor& g = layer.parameter(name).grad();
      CHECK((!g.defined() || max_abs(g) == 0.0));
    }
  }
  SECTION("a transformer of such blocks equals the dense one with zeroed MLPs") {
    auto dense_cfg = test::tiny_model(false);
    Transformer moe(cfg, 32, DType::F64), dense(dense_cfg, 33, DType::F64);
    for (auto& [name, p] : dense.named_parameters()) {
      if (name.find(".mlp.") != std::string::npos) {
        set_all(p, 0.0);
      } else {
        p.copy_from(moe.parameter(name));
      }
    }
    const Tensor tok = tokens_for(2, 12, 32, 34), tgt = tokens_for(2, 12, 32, 35);
    NoGradGuard g;
    auto a = moe.forward(tok, tgt), b = dense.forward(tok, tgt);
    CHECK(max_diff(a.logits, b.logits) == 0.0);
    CHECK(a.lm_loss.item() == b.lm_loss.item());
    REQUIRE(a.moe_stats.size() == 2);
    for (const auto& s : a.moe_stats) CHECK(s.noop_fraction == 1.0);
    // Top-C mode only: causal routing ignores noop_capacity (a token whose top probability is a
    // real expert goes there), so it is not the identity.
  }
}

TEST_CASE("integrated MoDE with no capacity on the no-op expert is a plain expert-choice MoE",
          "[moe]") {
  auto integrated_cfg = test::tiny_moe(false, /*noop_expert=*/true);
  integrated_cfg.mutable_moe()->set_noop_capacity(0.0);
  integrated_cfg.mutable_moe()->set_router_bias(true);
  integrated_cfg.mutable_moe()->set_z_weight(0.1);
  auto plain_cfg = integrated_cfg;
  plain_cfg.mutable_moe()->set_noop_expert(false);
  Rng rng_a(41), rng_b(42);
  MoeMlp integrated(integrated_cfg, rng_a, DType::F64), plain(plain_cfg, rng_b, DType::F64);
  // The no-op logit at -1e4 has probability exp(-1e4) = 0 exactly in double.
  integrated.parameter("router.bias").set(4, -1e4);
  plain.parameter("router.weight").copy_from(integrated.parameter("router.weight").narrow0(0, 4));
  plain.parameter("router.bias").copy_from(integrated.parameter("router.bias").narrow0(0, 4));
  for (const char* name : {"experts.up", "experts.down"})
    plain.parameter(name).copy_from(integrated.parameter(name));

  Rng rng(43);
  const Tensor x0 = randn({2, 12, 16}, rng, DType::F64), w = randn({2, 12, 16}, rng, DType::F64);
  Tensor xa = x0.clone().set_requires_grad(true), xb = x0.clone().set_requires_grad(true);
  const MoeOutput a = integrated.forward(xa), b = plain.forward(xb);
  CHECK(a.stats.noop_fraction == 0.0);
  CHECK(max_abs(a.out) > 1e-3);
  CHECK(max_diff(a.out, b.out) < 1e-12);
  CHECK(a.aux.item() == Approx(b.aux.item()).epsilon(1e-12));
  CHECK(a.stats.unrouted_fraction == b.stats.unrouted_fraction);
  objective(a.out, a.aux, w).backward();
  objective(b.out, b.aux, w).backward();
  CHECK(max_diff(xa.grad(), xb.grad()) < 1e-12);
  for (const char* name : {"experts.up", "experts.down"}) {
    INFO(name);
    CHECK(max_diff(integrated.parameter(name).grad(), plain.parameter(name).grad()) < 1e-12);
  }
  const Tensor& gw = integrated.parameter("router.weight").grad();
  const Tensor& gb = integrated.parameter("router.bias").grad();
  CHECK(max_diff(gw.narrow0(0, 4), plain.parameter("router.weight").grad()) < 1e-12);
  CHECK(max_diff(gb.narrow0(0, 4), plain.parameter("router.bias").grad()) < 1e-12);
  CHECK(max_abs(plain.parameter("router.weight").grad()) > 1e-6);
  CHECK(max_abs(gw.narrow0(4, 1)) == 0.0);  // the no-op row sees probability 0
}

// --- causal routing ---

TEST_CASE("MoeMlp::forward_causal: a token's output depends on that token alone", "[moe]") {
  auto cfg = test::tiny_moe(false, /*noop_expert=*/true);
  cfg.mutable_moe()->set_router_bias(true);
  Rng rng(51);
  MoeMlp layer(cfg, rng, DType::F64);
  // A no-op bias of +0.5 makes the no-op expert the top pick for a good share of tokens.
  layer.parameter("router.bias").set(4, 0.5);
  Tensor x = randn({2, 12, 16}, rng, DType::F64);
  NoGradGuard g;
  const Tensor out = layer.forward_causal(x);
  REQUIRE(out.shape() == Shape{2, 12, 16});

  SECTION("each row is p_top * expert_top(x), or zero when the top pick is the no-op expert") {
    const Tensor w = layer.parameter("router.weight"), bias = layer.parameter("router.bias");
    int noop_rows = 0, expert_rows = 0;
    for (int64_t i = 0; i < 24; ++i) {
      std::vector<double> logit(5), p(5);
      double mx = -1e300, z = 0;
      for (int64_t e = 0; e < 5; ++e) {
        logit[e] = bias.at(e);
        for (int64_t d = 0; d < 16; ++d) logit[e] += w.at(e * 16 + d) * x.at(i * 16 + d);
        mx = std::max(mx, logit[e]);
      }
      for (int64_t e = 0; e < 5; ++e) z += (p[e] = std::exp(logit[e] - mx));
      const int64_t top = std::max_element(p.begin(), p.end()) - p.begin();
      const Tensor row = out.view({24, 16}).narrow0(i, 1);
      INFO("token " << i << " top " << top);
      if (top == 4) {
        ++noop_rows;
        CHECK(max_abs(row) == 0.0);
      } else {
        ++expert_rows;
        const Tensor y = layer.experts().forward_one(top, x.view({24, 16}).narrow0(i, 1));
        for (int64_t d = 0; d < 16; ++d)
          CHECK(row.at(d) == Approx(p[top] / z * y.at(d)).margin(1e-12));
      }
    }
    INFO(noop_rows << " no-op rows, " << expert_rows << " expert rows");
    CHECK(noop_rows > 0);
    CHECK(expert_rows > 0);
  }
  SECTION("later tokens and other sequences never change a token's output") {
    Tensor changed = x.clone();
    Rng r2(52);
    changed.view({24, 16}).narrow0(19, 5).copy_from(
        randn({5, 16}, r2, DType::F64));                                  // seq 1, 7..11
    changed.narrow0(0, 1).copy_from(randn({1, 12, 16}, r2, DType::F64));  // all of seq 0
    const Tensor out2 = layer.forward_causal(changed);
    CHECK(max_diff(out.narrow0(1, 1).view({12, 16}).narrow0(0, 7),
                   out2.narrow0(1, 1).view({12, 16}).narrow0(0, 7)) < 1e-12);
    CHECK(max_diff(out.narrow0(1, 1), out2.narrow0(1, 1)) > 1e-6);
    const Tensor alone = layer.forward_causal(x.narrow0(1, 1).clone());
    CHECK(max_diff(alone, out.narrow0(1, 1)) < 1e-12);
  }
  SECTION("noop_capacity plays no part") {
    auto other = cfg;
    other.mutable_moe()->set_noop_capacity(0.9);
    Rng same(51);
    MoeMlp layer2(other, same, DType::F64);
    layer2.parameter("router.bias").set(4, 0.5);
    CHECK(max_diff(layer2.forward_causal(x), out) == 0.0);
  }
}

TEST_CASE(
    "MoDE models in causal mode: later tokens never change earlier logits, and decoding "
    "through the caches equals the causal forward",
    "[moe]") {
  for (bool staged : {false, true}) {
    DYNAMIC_SECTION((staged ? "staged" : "integrated")) {
      auto cfg = test::tiny_moe(staged, /*noop_expert=*/!staged);
      // Staged: the MoD router decides causal entry, its bias set to centre r on this sequence
      // (the top-C mean), so that some tokens enter the routed block and some do not.
      cfg.mutable_mod()->mutable_causal()->set_method(modtrain::CausalRoutingConfig::AUX_BCE);
      cfg.mutable_mod()->mutable_router()->set_bias(true);
      Transformer m(cfg, 61, DType::F64);
      NoGradGuard g;
      Tensor a = tokens_for(1, 12, 32, 62);
      if (staged) {
        auto stats = m.forward(a, Tensor()).stats;
        resolve_stats(stats);
        const double mean = stats.at(0).router_mean;
        m.parameter("blocks.1.router.proj.bias").set(0, -mean);
      }
      Tensor b = a.clone();
      for (int64_t t = 7; t < 12; ++t) b.set(t, (static_cast<int64_t>(a.at(t)) + 5) % 32);
      const Tensor la = m.forward(a, Tensor(), RoutingMode::Causal).logits;
      const Tensor lb = m.forward(b, Tensor(), RoutingMode::Causal).logits;
      CHECK(max_diff(la.view({12, 32}).narrow0(0, 7), lb.view({12, 32}).narrow0(0, 7)) < 1e-12);
      CHECK(max_diff(la, lb) > 1e-6);
      auto caches = m.make_caches(12);
      for (int64_t t = 0; t < 12; ++t) {
        const Tensor step = m.decode_step(static_cast<int64_t>(a.at(t)), t, caches);
        INFO("position " << t);
        CHECK(max_diff(step, la.view({12, 32}).narrow0(t, 1)) < 1e-10);
      }
      if (staged) {
        CHECK(caches[1].size() < 12);
        CHECK(caches[1].size() > 0);
      }
      // The batch runs sequence by sequence: a batch of two equals each alone.
      Tensor pair = Tensor::empty({2, 12}, DType::I64);
      pair.narrow0(0, 1).copy_from(a);
      pair.narrow0(1, 1).copy_from(b);
      const Tensor lp = m.forward(pair, Tensor(), RoutingMode::Causal).logits;
      CHECK(max_diff(lp.narrow0(0, 1), la) < 1e-12);
      CHECK(max_diff(lp.narrow0(1, 1), lb) < 1e-12);
    }
  }
}

// --- FLOPs and parameters ---

TEST_CASE(
    "MoE FLOPs: the router plus the active experts, parameters: E expert MLPs plus the "
    "router",
    "[moe][flops]") {
  const auto dense_cfg = test::tiny_model(false);  // D 16, ff 32, S 12, GELU
  const auto dense = count_flops(dense_cfg);
  const double mlp = 2.0 * 2 * 16 * 32;  // dense MLP FLOPs per token

  // Expert choice, E = 3, capacity factor 1: k = 4, 3 * 4 = 12 slots for 12 tokens, so the
  // experts cost one dense MLP per token, plus the router's 2 * D * E.
  auto ec_cfg = test::tiny_moe(false);
  ec_cfg.mutable_moe()->set_n_experts(3);
  const auto ec = count_flops(ec_cfg);
  // Integrated, E = 3, noop_capacity 0.5: 6 tokens skip, k = 2, 6 slots: half the expert
  // FLOPs; the router has E + 1 outputs.
  auto int_cfg = test::tiny_moe(false, /*noop_expert=*/true);
  int_cfg.mutable_moe()->set_n_experts(3);
  const auto integ = count_flops(int_cfg);
  REQUIRE(ec.blocks.size() == 2);
  for (int b = 0; b < 2; ++b) {
    INFO("block " << b);
    CHECK(ec.blocks[b].moe);
    CHECK_FALSE(dense.blocks[b].moe);
    CHECK(ec.blocks[b].forward_per_token ==
          Approx(dense.blocks[b].forward_per_token + 2.0 * 16 * 3));
    CHECK(integ.blocks[b].forward_per_token ==
          Approx(dense.blocks[b].forward_per_token - 0.5 * mlp + 2.0 * 16 * 4));
  }
  CHECK(ec.forward_per_token == Approx(dense.forward_per_token + 2 * 2.0 * 16 * 3));
  CHECK(ec.training_per_token == Approx(3 * ec.forward_per_token));

  // Staged, E = 4: the routed block's MoE sees C = 3 tokens; k = max(1, round(3/4)) = 1, so 4
  // expert rows for 3 tokens.
  const auto staged = count_flops(test::tiny_moe(true));
  const double proj = 8.0 * 16 * 16, attn3 = 2.0 * 16 * 4;
  const double moe3 = 2.0 * 16 * 4 + 4.0 / 3.0 * mlp;
  CHECK(staged.blocks[1].capacity == 3);
  CHECK(staged.blocks[1].forward_per_token ==
        Approx((proj + moe3 + attn3) * 3 / 12 + 2 * 16 + 2 * 16 * 8 + 2 * 8));

  // Parameters, by hand and against the built model.
  const int64_t dense_params = 32 * 16 + 2 * (4 * 256 + 2 * 16 * 32 + 32) + 16;
  CHECK(dense.parameters == dense_params);
  CHECK(ec.parameters == dense_params + 2 * (2 * (2 * 16 * 32) + 3 * 16));  // 3 experts, router
  auto swiglu_cfg = test::tiny_moe(true, false);
  swiglu_cfg.set_mlp(modtrain::ModelConfig::SWIGLU);
  swiglu_cfg.mutable_moe()->set_d_expert(24);
  swiglu_cfg.mutable_moe()->set_router_bias(true);
  auto int_bias_cfg = int_cfg;
  int_bias_cfg.mutable_moe()->set_router_bias(true);
  auto explicit_cfg = test::tiny_moe(false);
  explicit_cfg.mutable_moe()->set_schedule(modtrain::MoDConfig::EXPLICIT);
  explicit_cfg.mutable_moe()->add_moe_blocks(1);
  CHECK(count_flops(int_bias_cfg).parameters ==
        dense_params + 2 * (2 * (2 * 16 * 32) + 4 * 16 + 4));
  auto layer_norm_cfg = int_cfg;
  layer_norm_cfg.set_norm(modtrain::ModelConfig::LAYER);
  for (const auto& c : {ec_cfg, int_cfg, int_bias_cfg, test::tiny_moe(true), swiglu_cfg,
                        explicit_cfg, layer_norm_cfg}) {
    INFO(c.ShortDebugString());
    CHECK(count_flops(c).parameters == Transformer(c, 1).num_parameters());
  }
  const auto ex = count_flops(explicit_cfg);
  CHECK_FALSE(ex.blocks[0].moe);
  CHECK(ex.blocks[1].moe);
}

// --- training ---

TEST_CASE("tiny MoE, staged and integrated MoDE models overfit a fixed batch", "[moe][train]") {
  struct Variant {
    const char* name;
    modtrain::ModelConfig cfg;
  };
  for (const auto& v :
       {Variant{"MoE", test::tiny_moe(false)}, Variant{"staged", test::tiny_moe(true)},
        Variant{"integrated", test::tiny_moe(false, true)}}) {
    DYNAMIC_SECTION(v.name) {
      auto cfg = v.cfg;
      cfg.set_init_std(0.05);
      Transformer m(cfg, 1);
      const test::OverfitLosses l = test::overfit_fixed_batch(m, 200, [](Transformer& model) {
        // Attention alone can memorise this batch, so the loss below cannot tell a dead MoE;
        // every parameter (experts, routers, predictor) getting a gradient can.
        for (const auto& [name, p] : model.named_parameters()) {
          INFO(name);
          REQUIRE(p.grad().defined());
          CHECK(max_abs(p.grad()) > 0.0);
        }
      });
      const double first = l.first, last = l.last;
      INFO("loss " << first << " -> " << last);
      CHECK(first > 3.0);  // about ln 32 = 3.47 at init
      CHECK(last < 0.3);   // about 0.005 when written
    }
  }
}

// Causal evaluation runs one expert at a time on its slice of the stacked weights. Where the
// optimizer keeps weight copies it slices the copy (under ZeRO-3's BF16 gathers the copy is all
// that is whole, parallel/zero3.h): the same values as casting the master's slice, and no read
// of a released master. F64 copies of f32 masters stand in for bf16 (the CPU computes in f32
// and f64 only).
TEST_CASE("an expert on its own reads its slice of the weight copy, not of the master", "[moe]") {
  Rng rng(11);
  const Experts experts(3, 8, 12, /*swiglu=*/true, 0.2, 0.2, rng, DType::F32);
  Rng xr(12);
  const Tensor x = randn({5, 8}, xr, DType::F32, 1.0);
  NoGradGuard no_grad;
  AutocastGuard f64(DType::F64);
  std::vector<Tensor> cast;  // each expert on the master's slices, cast
  for (int64_t e = 0; e < 3; ++e) cast.push_back(experts.forward_one(e, x));
  const auto params = experts.named_parameters();
  for (const auto& [name, p] : params) keep_weight_copy(p, DType::F64);
  for (const auto& [name, p] : params) (void)weight_copy_for(p, DType::F64);  // written now
  for (const auto& [name, p] : params) {  // the masters released, the copies current
    p.impl()->storage->resize(0);
    mark_copy_current(p);
  }
  for (int64_t e = 0; e < 3; ++e) {
    INFO("expert " << e);
    const Tensor y = experts.forward_one(e, x);
    REQUIRE(y.dtype() == cast[e].dtype());
    CHECK(max_diff(y, cast[e]) == 0.0);
  }
  for (const auto& [name, p] : params) drop_weight_copy(p);
}
