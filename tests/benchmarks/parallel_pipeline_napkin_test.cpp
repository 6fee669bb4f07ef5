// parallel_bench's prediction for pipeline layouts (benchmarks/parallel/parallel_pipeline_napkin.h)
// against the whole-model napkin and step time it must add up to: the stages' parameters and tp
// bytes sum to the model's, the ranks' compute to predict_step's, and the pipeline terms (p2p
// bytes, the bubble, the transfers) follow their formulas.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "benchmarks/parallel/parallel_napkin.h"
#include "benchmarks/parallel/parallel_pipeline_napkin.h"
#include "benchmarks/parallel/parallel_step_time.h"
#include "configs/config.h"
#include "model/flops.h"

namespace {

using mod::bench::Layout;
using mod::bench::parse_layout;

modtrain::RunConfig recipe(const std::string& name, const std::vector<std::string>& sets = {}) {
  return mod::config::load(std::string(MOD_SOURCE_DIR) + "/configs/recipes/" + name + ".textproto",
                           sets);
}

}  // namespace

TEST_CASE("pipeline layouts parse and label themselves and +vK needs pp", "[bench]") {
  const Layout l = parse_layout("dp8xtp4xpp2+v2");
  CHECK(l.dp == 8);
  CHECK(l.tp == 4);
  CHECK(l.pp == 2);
  CHECK(l.v == 2);
  CHECK(l.world() == 64);
  CHECK(l.label() == "dp8xtp4xpp2+v2");
  CHECK(parse_layout("pp4").label() == "pp4");
  CHECK(parse_layout("tp2xpp2+zero1").label() == "tp2xpp2+zero1");
  CHECK(parse_layout("dp2").label() == "dp2");
  CHECK_THROWS_WITH(parse_layout("dp8+v2"),
                    Catch::Contains("layout 'dp8+v2'") && Catch::Contains("+v2 needs ppN"));
  CHECK_THROWS_WITH(parse_layout("dp8xqp2"), Catch::Contains("ppN"));
}

TEST_CASE("pipeline prediction: stages add up to the whole model's napkin and compute",
          "[bench]") {
  const auto f = mod::bench::fabric_preset("ib-400g");
  for (const char* name : {"gpt2_small_dense", "gpt2_small_mod"}) {
    const auto cfg = recipe(name);
    const auto& m = cfg.model();
    for (const char* text : {"dp8xpp2", "dp4xtp2xpp2", "dp2xtp2xpp4+v2", "dp2xpp4+zero1",
                             "dp2xtp2xpp2+sp+zero1", "dp2xtp4xpp2+v2+sp"}) {
      INFO(name << " " << text);
      const Layout l = parse_layout(text);
      REQUIRE(mod::bench::pipeline_misfit(cfg, l).empty());
      const auto pl = mod::bench::predict_pipeline(cfg, l, f);
      REQUIRE(static_cast<int>(pl.ranks.size()) == l.pp);
      Layout flat{l.dp, l.tp, 1, l.zero_stage};
      flat.sp = l.sp;
      const auto whole = mod::bench::napkin(cfg, flat);
      // Every parameter on exactly one stage, plus the tied embedding's copy as the last
      // stage's head (split by tp like the embedding).
      double local = 0, tp_bytes = 0, busy = 0;
      for (const auto& r : pl.ranks) {
        local += r.local;
        tp_bytes += r.tp_bytes;
        busy += r.busy;
      }
      const double head_copy = m.tie_embeddings() ? double(m.vocab_size()) * m.d_model() / l.tp : 0;
      CHECK(local == Approx(whole.local + head_copy));
      CHECK(tp_bytes == Approx(whole.tp_bytes));
      // The ranks' compute (without tp) is the whole step's compute over dp x tp, shared out.
      if (l.tp == 1) {
        const auto t = mod::bench::predict_step(cfg, flat, whole, f);
        CHECK(busy == Approx(t.compute));
      }
      // p2p: each micro-batch's activation leaves every virtual stage but the last, its gradient
      // every one but the first: 2 (pp v - 1) transfers a micro-batch in all; under sequence
      // parallelism each tp rank's [B/dp, T/tp, D].
      double p2p = 0;
      for (const auto& r : pl.ranks) p2p += r.p2p_bytes;
      const double act = double(cfg.train().batch_size()) / l.dp * m.seq_len() / (l.sp ? l.tp : 1) *
                         m.d_model() * 4;
      CHECK(p2p == Approx(2.0 * (l.pp * l.v - 1) * cfg.train().grad_accum() * act));
      CHECK(pl.transfer == Approx(act / 40e9 + 30e-6));
      CHECK(pl.bubble_equal ==
            Approx((l.pp - 1.0) / (l.v * cfg.train().grad_accum() + l.pp - 1.0)));
      // Unequal stages and transfers only add idle time; the step is the pipeline and then the
      // gradients; overlap never makes it longer.
      CHECK(pl.bubble >= pl.bubble_equal - 1e-9);
      CHECK(pl.makespan >= pl.busiest());
      CHECK(pl.step(true) <= pl.step(false));
      CHECK(pl.step(true) >= pl.makespan);
      for (const auto& r : pl.ranks) {
        CHECK(r.grad_exposed <= r.grad_comm);
        CHECK(r.finish <= pl.makespan * (1 + 1e-12));
        CHECK((r.gather > 0) == l.sharded());
      }
    }
  }
}

// Sequence parallelism under pp (parallel/pipeline_runtime.cpp link_shape): each tp rank sends
// its [B/dp, T/tp, D] part to the same tp rank of the next stage, so a rank's p2p bytes and each
// transfer's bandwidth term are 1/tp of plain tp's; its tp bytes are plain tp's plus the routed
// rows (MoD) and, once a step, the partial gradients, as in the flat napkin.
TEST_CASE("pipeline prediction: sequence parallelism sends 1/tp of the stream between stages",
          "[bench]") {
  const auto f = mod::bench::fabric_preset("ib-400g");
  for (const char* name : {"gpt2_small_dense", "gpt2_small_mod"}) {
    const auto cfg = recipe(name);
    for (const char* text : {"dp2xtp2xpp2", "dp2xtp4xpp2+v2", "tp2xpp4"}) {
      INFO(name << " " << text);
      const Layout plain = parse_layout(text);
      Layout sp = plain;
      sp.sp = true;
      REQUIRE(mod::bench::pipeline_misfit(cfg, sp).empty());
      const auto a = mod::bench::predict_pipeline(cfg, plain, f);
      const auto b = mod::bench::predict_pipeline(cfg, sp, f);
      REQUIRE(a.ranks.size() == b.ranks.size());
      for (size_t r = 0; r < a.ranks.size(); ++r) {
        CHECK(b.ranks[r].p2p_bytes == Approx(a.ranks[r].p2p_bytes / plain.tp));
        CHECK(b.ranks[r].tp_bytes > a.ranks[r].tp_bytes);  // partial gradients at least
        CHECK(b.ranks[r].tp_step > 0);
        CHECK(a.ranks[r].tp_step == 0);
      }
      CHECK(b.transfer - 30e-6 == Approx((a.transfer - 30e-6) / plain.tp));
      CHECK(b.bubble <= a.bubble + 0.01);  // cheaper transfers; more tp calls on each stage
    }
  }
}

TEST_CASE("pipeline prediction: interleaving shrinks the bubble, slower links grow it",
          "[bench]") {
  auto f = mod::bench::fabric_preset("nvlink-h100");
  const auto cfg = recipe("gpt2_small_dense");
  const auto plain = mod::bench::predict_pipeline(cfg, parse_layout("dp2xpp4"), f);
  const auto inter = mod::bench::predict_pipeline(cfg, parse_layout("dp2xpp4+v2"), f);
  CHECK(inter.bubble < plain.bubble);
  CHECK(inter.makespan < plain.makespan);
  f.dp_busbw /= 100;
  const auto slow = mod::bench::predict_pipeline(cfg, parse_layout("dp2xpp4"), f);
  CHECK(slow.transfer > plain.transfer);
  CHECK(slow.bubble > plain.bubble);
  // More than one stage per block, interleaving without a multiple of pp, experts: named.
  CHECK(mod::bench::pipeline_misfit(cfg, parse_layout("pp8+v2")) ==
        "model.n_layers 12 < pp x v = 16 stages of a block at least");
  CHECK(mod::bench::pipeline_misfit(recipe("gpt2_small_dense", {"train.grad_accum=6"}),
                                    parse_layout("pp4+v2")) ==
        "interleaved 1F1B needs train.grad_accum (6) to be a multiple of pp 4");
}
