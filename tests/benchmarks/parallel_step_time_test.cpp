// parallel_bench's step-time prediction (benchmarks/parallel/parallel_step_time.h): the overlap
// schedule on hand-made buckets, the gradient buckets against the napkin's bytes, and the
// prediction's compute and communication terms against their formulas.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/parallel/parallel_napkin.h"
#include "benchmarks/parallel/parallel_step_time.h"
#include "configs/config.h"
#include "model/flops.h"

namespace {

using mod::bench::BucketTime;
using mod::bench::Layout;
using mod::bench::overlap_buckets;

modtrain::RunConfig recipe(const std::string& name, const std::vector<std::string>& sets = {}) {
  return mod::config::load(std::string(MOD_SOURCE_DIR) + "/configs/recipes/" + name + ".textproto",
                           sets);
}

// n buckets, bucket i ready at (i + 1) / n of backward, each taking `transfer`.
std::vector<BucketTime> uniform(int n, double backward, double transfer) {
  std::vector<BucketTime> b;
  for (int i = 0; i < n; ++i) b.push_back({backward * (i + 1) / n, transfer});
  return b;
}

}  // namespace

TEST_CASE("overlap: comm much shorter than backward exposes the last bucket only", "[bench]") {
  const auto o = overlap_buckets(uniform(10, 1.0, 0.01), 1.0);
  CHECK(o.comm == Approx(0.1));
  CHECK(o.end == Approx(1.01));
  CHECK(o.exposed == Approx(0.01));
}

TEST_CASE("overlap: comm much longer than backward exposes comm - backward + the first wait",
          "[bench]") {
  // Bucket 0 is ready at 0.1 and the stream never idles after: end = 0.1 + 10 x 1.
  const auto o = overlap_buckets(uniform(10, 1.0, 1.0), 1.0);
  CHECK(o.comm == Approx(10.0));
  CHECK(o.end == Approx(10.1));
  CHECK(o.exposed == Approx(10.0 - 1.0 + 0.1));
}

TEST_CASE("overlap: one bucket ready at the end of backward does not overlap at all", "[bench]") {
  const auto o = overlap_buckets({{2.0, 0.7}}, 2.0);
  CHECK(o.exposed == Approx(0.7));
  CHECK(o.exposed == Approx(o.comm));
}

TEST_CASE("overlap: a bucket waits for the previous transfer and for its own readiness",
          "[bench]") {
  // Ready 1, 2, 3; 1.5 each: [1, 2.5], [2.5, 4], [4, 5.5]. Then an idle gap: ready 1 and 3,
  // 0.5 each: [1, 1.5], [3, 3.5].
  const auto busy = overlap_buckets({{1, 1.5}, {2, 1.5}, {3, 1.5}}, 3.0);
  CHECK(busy.end == Approx(5.5));
  CHECK(busy.exposed == Approx(2.5));
  const auto idle = overlap_buckets({{1, 0.5}, {3, 0.5}}, 3.0);
  CHECK(idle.end == Approx(3.5));
  CHECK(idle.exposed == Approx(0.5));
  CHECK(overlap_buckets({}, 1.0).exposed == 0);
}

TEST_CASE("overlap: exposed lies between the last transfer and the whole comm", "[bench]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const double backward = 0.1 + u(rng);
    std::vector<BucketTime> b(1 + trial % 9);
    for (auto& x : b) x = {u(rng) * backward, u(rng) * (trial % 2 ? 0.01 : 1.0)};
    std::sort(b.begin(), b.end(),
              [](const BucketTime& x, const BucketTime& y) { return x.ready < y.ready; });
    b.back().ready = backward;  // the embedding is final last
    const auto o = overlap_buckets(b, backward);
    CHECK(o.exposed >= b.back().transfer * (1 - 1e-12));
    CHECK(o.exposed <= o.comm * (1 + 1e-12));
  }
}

TEST_CASE("overlap: a bucket ready after backward or a negative time is an error", "[bench]") {
  CHECK_THROWS_AS(overlap_buckets({{1.5, 0.1}}, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(overlap_buckets({{0.5, -0.1}}, 1.0), std::invalid_argument);
  CHECK_THROWS_AS(overlap_buckets({}, -1.0), std::invalid_argument);
}

TEST_CASE("grad_buckets hold the napkin's gradient bytes, packed as GradBucketer packs them",
          "[bench]") {
  const double cap = 25.0 * 1024 * 1024;
  for (const char* name : {"gpt2_small_dense", "gpt2_small_mod", "tiny_moe"}) {
    const auto cfg = recipe(name);
    for (const char* text :
         {"dp8", "dp4xtp2", "dp2xtp4", "dp8+ep2", "dp8+ep4+zero1", "dp8+zero2"}) {
      const Layout l = mod::bench::parse_layout(text);
      if (l.ep > 1 && !cfg.model().moe().enabled()) continue;
      INFO(name << " " << text);
      const auto nk = mod::bench::napkin(cfg, l);
      const auto buckets = mod::bench::grad_buckets(cfg, l);
      double sent = 0;
      for (const auto& b : buckets) {
        CHECK(b.reduce_scatter == l.sharded());
        sent += b.sent();
      }
      // ZeRO-1 and ZeRO-2: the reduce-scatter and the all-gather send as much as each other.
      CHECK(sent * (l.sharded() ? 2.0 : 1.0) == Approx(nk.dp_bytes + nk.edp_bytes).epsilon(1e-12));
      // Every bucket but the last of its group is at least bucket_mb; the last dense one holds
      // the embedding, final when backward ends.
      int dense = 0;
      for (const auto& b : buckets) dense += !b.expert;
      for (int i = 0; i + 1 < dense; ++i) CHECK(buckets[i].bytes >= cap);
      REQUIRE(dense > 0);
      CHECK(buckets[dense - 1].ready_fraction == 1.0);
      for (int i = 1; i < dense; ++i)
        CHECK(buckets[i].ready_fraction >= buckets[i - 1].ready_fraction);
      CHECK(buckets[0].ready_fraction > 0);
      if (dense > 1) CHECK(buckets[0].ready_fraction < 1);
    }
  }
  // No data parallelism, no buckets; dp2 of a model under 25 MiB, one bucket.
  CHECK(mod::bench::grad_buckets(recipe("gpt2_small_dense"), Layout{1, 8, 1, false}).empty());
  CHECK(mod::bench::grad_buckets(recipe("tiny_dense"), Layout{2, 1, 1, false}).size() == 1);
}

TEST_CASE("predict_step: compute from the FLOP count, comm from bytes / busbw + latency",
          "[bench]") {
  mod::bench::Fabric f = mod::bench::fabric_preset("ib-400g");
  const auto cfg = recipe("gpt2_small_dense");
  const double tokens = 64.0 * 8 * 1024;
  const double flops = mod::model::count_flops(cfg.model()).training_per_token * tokens;
  for (const char* text : {"dp64", "dp8", "dp4xtp2+zero1", "dp4xtp2+zero2"}) {
    INFO(text);
    const Layout l = mod::bench::parse_layout(text);
    const auto nk = mod::bench::napkin(cfg, l);
    const auto t = mod::bench::predict_step(cfg, l, nk, f);
    CHECK(t.compute == Approx(flops / (l.dp * l.tp) / (989e12 * 0.4)));
    CHECK(t.last_backward == Approx(t.compute * 2 / 3 / 8));
    const double grad_bytes = nk.dp_bytes * (l.sharded() ? 1.0 / 2 : 1.0);
    CHECK(t.grad_comm == Approx(grad_bytes / 40e9 + t.buckets * 30e-6));
    CHECK(t.gather == Approx(l.sharded() ? nk.dp_bytes / 2 / 40e9 + 30e-6 : 0.0));
    CHECK(t.tp == Approx(l.tp > 1 ? nk.tp_bytes / 360e9 + (8 * (4 * 12 + 4) + 1) * 10e-6 : 0.0));
    CHECK(t.exposed_grad <= t.grad_comm);
    CHECK(t.step(true) <= t.step(false));
    CHECK(t.step(false) == Approx(t.compute + t.comm()));
  }
  // Micro-batches: compute scales with them, the gradient comm and the overlap window do not.
  const Layout dp8{8, 1, 1, false};
  const auto one = mod::bench::predict_step(cfg, dp8, mod::bench::napkin(cfg, dp8), f);
  const auto cfg16 = recipe("gpt2_small_dense", {"train.grad_accum=16"});
  const auto two = mod::bench::predict_step(cfg16, dp8, mod::bench::napkin(cfg16, dp8), f);
  CHECK(two.compute == Approx(2 * one.compute));
  CHECK(two.last_backward == Approx(one.last_backward));
  CHECK(two.grad_comm == Approx(one.grad_comm));
  CHECK(two.exposed_grad == Approx(one.exposed_grad));
  // A slower network exposes more; faster compute overlaps less.
  f.dp_busbw /= 10;
  const auto slow = mod::bench::predict_step(cfg, dp8, mod::bench::napkin(cfg, dp8), f);
  CHECK(slow.exposed_grad > one.exposed_grad);
}

TEST_CASE("fabric presets: the documented numbers, and an unknown name lists them", "[bench]") {
  const auto nv = mod::bench::fabric_preset("nvlink-h100");
  CHECK(nv.dp_busbw == 360e9);
  CHECK(nv.peak_flops == 989e12);
  CHECK(nv.mfu == 0.4);
  const auto ib = mod::bench::fabric_preset("ib-400g");
  CHECK(ib.dp_busbw == 40e9);
  CHECK(ib.tp_busbw == 360e9);
  try {
    mod::bench::fabric_preset("ethernet");
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "--fabric 'ethernet': expected one of nvlink-h100, ib-400g");
  }
}

TEST_CASE("napkin: ZeRO-3 sends the reduce-scatter once and the gathers per micro-batch",
          "[bench]") {
  for (const char* name : {"gpt2_small_dense", "tiny_mod"}) {
    for (int accum : {1, 4}) {
      INFO(name << ", grad_accum " << accum);
      const auto cfg = recipe(name, {"train.grad_accum=" + std::to_string(accum)});
      const auto plain = mod::bench::napkin(cfg, mod::bench::parse_layout("dp8"));
      const auto z3 = mod::bench::napkin(cfg, mod::bench::parse_layout("dp8+zero3"));
      const double p = static_cast<double>(z3.params), blocks = p - static_cast<double>(z3.outer);
      CHECK(z3.outer > 0);
      CHECK(z3.dp_bytes == Approx(7.0 / 8 * 4 * (p + accum * (p + blocks))));
      // One micro-batch: between plain dp's bytes and 1.5x (the outer unit is gathered once).
      if (accum == 1) {
        CHECK(z3.dp_bytes / plain.dp_bytes > 1.0);
        CHECK(z3.dp_bytes / plain.dp_bytes <= 1.5);
      }
    }
  }
}

TEST_CASE("napkin: sequence parallelism adds only the routed rows and the partial gradients",
          "[bench]") {
  const auto dense = recipe("tiny_dense");
  const auto tp = mod::bench::napkin(dense, mod::bench::parse_layout("tp2"));
  const auto sp = mod::bench::napkin(dense, mod::bench::parse_layout("tp2+sp"));
  // tiny_dense: the norms' gradients only (docs/parallel.md: 3,328 of them, 13,312 bytes).
  CHECK(sp.seq_partial == 3328);
  CHECK(sp.tp_bytes - tp.tp_bytes == Approx(13312));
  const auto mod_cfg = recipe("tiny_mod");
  const auto mtp = mod::bench::napkin(mod_cfg, mod::bench::parse_layout("tp2"));
  const auto msp = mod::bench::napkin(mod_cfg, mod::bench::parse_layout("tp2+sp"));
  CHECK(msp.seq_partial == 52099);
  CHECK(msp.tp_bytes > mtp.tp_bytes + 2 * 0.5 * 4 * 52099);
  CHECK(mod::bench::parse_layout("dp2xtp2+sp").label() == "dp2xtp2+sp");
  CHECK(mod::bench::parse_layout("dp8+zero3").label() == "dp8+zero3");
  CHECK_THROWS_WITH(mod::bench::parse_layout("dp2+zero4"), Catch::Contains("+zero3, +sp"));
}

TEST_CASE("zero3_step: prefetch hides every gather behind compute but the first ones",
          "[bench]") {
  // Latency only (an unlimited bus), far below any block's compute: with prefetch a micro-batch
  // waits for the outer unit, block 0 (nothing to hide behind) and the last block's first
  // backward gather; the last two reduce-scatters (block 0, the outer unit) follow backward.
  mod::bench::Fabric f = mod::bench::fabric_preset("ib-400g");
  f.dp_busbw = 1e30;
  f.dp_latency = 1e-6;
  for (int accum : {1, 3}) {
    INFO("grad_accum " << accum);
    const auto cfg = recipe("gpt2_small_dense", {"train.grad_accum=" + std::to_string(accum)});
    const Layout l = mod::bench::parse_layout("dp8+zero3");
    const int blocks = cfg.model().n_layers();
    const auto with = mod::bench::zero3_step(cfg, l, f, 1.0, true);
    const auto without = mod::bench::zero3_step(cfg, l, f, 1.0, false);
    CHECK(with.gather == Approx(accum * (1 + 2 * blocks) * 1e-6));
    CHECK(with.reduce == Approx((1 + blocks) * 1e-6));
    CHECK(with.stalls == Approx(accum * 3 * 1e-6));
    CHECK(with.tail == Approx(2e-6));
    // Without prefetch every gather stalls, and a backward gather also waits for the block
    // after's reduce-scatter in the last micro-batch.
    CHECK(without.stalls == Approx(accum * (1 + 2 * blocks) * 1e-6 + (blocks - 1) * 1e-6));
    CHECK(without.gather == Approx(with.gather));
  }
  // A slow bus: prefetch still hides a block's gather behind the block before.
  f.dp_busbw = 1e9;
  const auto cfg = recipe("gpt2_small_dense");
  const auto with = mod::bench::zero3_step(cfg, mod::bench::parse_layout("dp8+zero3"), f, 1.0, true);
  const auto without =
      mod::bench::zero3_step(cfg, mod::bench::parse_layout("dp8+zero3"), f, 1.0, false);
  CHECK(with.stalls + with.tail < without.stalls + without.tail);
}
