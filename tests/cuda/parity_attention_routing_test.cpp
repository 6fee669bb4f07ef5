// CUDA against CPU, part 3: rope, attention (forward and backward) and the MoD routing kernels
// (gather_rows, scatter_add_rows, topk_rows, routing_summary). Attention runs for Dh 16, 64 and 128
// over causal positions 0..T-1, MoD-routed positions (T = C tokens, increasing with gaps), routed
// queries against every key, decoding (T = 1 against S cached keys), and queries that see no key.
// Where q_pos and k_pos hold the same positions and T == S, it runs twice: with one tensor for both
// and with k_pos a separate copy. In bf16, lse is tried both as bf16 (what
// core/ops/attention.cpp allocates) and as f32 (the kernels take either); cuDNN runs only for
// one position tensor with an f32 lse (and, for the backward before cuDNN 9.16, T % 128 == 0),
// the modtrain kernel everywhere else. Every path must match the CPU.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "tests/cuda/backend_parity.h"

using namespace mod;
using namespace mod::parity;

namespace {

// [B, n] index tensor from one row per batch entry.
Tensor pos_tensor(const std::vector<std::vector<int64_t>>& rows, DType dtype) {
  std::vector<int64_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  return indices(flat, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())},
                 dtype);
}

// Strictly increasing positions with random gaps of 1 to max_gap, starting at 0.
std::vector<int64_t> gapped(int64_t n, int64_t max_gap, Rng& rng) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  int64_t p = 0;
  for (auto& x : v) {
    x = p;
    p += 1 + rng.below(max_gap);
  }
  return v;
}

struct AttentionCase {
  std::string what;
  int64_t heads;
  std::vector<std::vector<int64_t>> q_pos, k_pos;  // one row per batch entry
  DType pos_type;
};

std::vector<AttentionCase> attention_cases(Rng& rng) {
  std::vector<AttentionCase> cases;
  const auto causal = iota(256), odd = iota(130);  // 130 leaves partial 64- and 128-row tiles
  cases.push_back({"causal, positions 0..T-1 (T = S = 256)", 2, {causal, causal}, {causal, causal},
                   DType::I64});
  cases.push_back({"causal, positions 0..T-1 (T = S = 130)", 1, {odd, odd}, {odd, odd},
                   DType::I32});
  // MoD: each sequence keeps C = 128 of 384 tokens; they attend among themselves.
  const auto m0 = sorted_subset(128, 384, rng), m1 = sorted_subset(128, 384, rng);
  cases.push_back({"MoD-routed, T = S = C = 128 of 384, increasing with gaps", 3, {m0, m1},
                   {m0, m1}, DType::I32});
  // Routed queries against all 192 keys (T != S, each query sees a different prefix).
  const auto r0 = sorted_subset(48, 192, rng), r1 = sorted_subset(48, 192, rng);
  const auto all = iota(192);
  cases.push_back({"routed queries (T = 48) against every key (S = 192)", 2, {r0, r1}, {all, all},
                   DType::I64});
  // Decoding: one new token per sequence against S = 333 cached keys; row 1 after a gap.
  const auto cache = iota(333);
  cases.push_back({"decoding, T = 1 against S = 333 cached keys", 2, {{332}, {400}},
                   {cache, cache}, DType::I64});
  cases.push_back({"one token, T = S = 1", 1, {{0}}, {{0}}, DType::I32});
  // Queries before the first key get the empty sum (core/backend.h): 40 and 70 of 100 here,
  // so some query tiles are blind throughout and some in part.
  cases.push_back({"queries before the first key (out 0, lse -inf)",
                   2,
                   {iota(100), iota(100)},
                   {iota(100, 40), iota(100, 70)},
                   DType::I64});
  return cases;
}

}  // namespace

TEST_CASE("cuda: rope forward and inverse, non-contiguous and large positions", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType pos_type = GENERATE(DType::I32, DType::I64);
  Rng rng(301);
  // Row 1 climbs to about 10^5: angles must be formed in double (the CPU's rule), or they lose
  // digits long before that.
  const Tensor pos = pos_tensor({iota(37), gapped(37, 5000, rng)}, pos_type);
  // Dh 6: three pairs, so one element a thread; Dh 520: pairs past the 256 frequencies passed
  // from the host take the device's pow, and at 8 heads a token has more column packs (2080 in
  // bf16, 1040 in f64) than a block's threads hold in registers.
  for (int64_t dh : {int64_t{6}, int64_t{16}, int64_t{64}, int64_t{128}, int64_t{520}})
    for (bool inverse : {false, true}) {
      INFO("Dh " << dh << ", inverse " << inverse << ", positions " << dtype_name(pos_type));
      const Shape shape{2, 37, dh > 256 ? 8 : 3, dh};
      check_parity(p, {in("x", normal(shape, rng)), in("pos", pos), out("y", shape)},
                   [&](Backend& b, std::vector<Tensor>& t) {
                     b.rope(t[0], t[1], 10000.0, inverse, t[2]);
                   });
    }
}

TEST_CASE("cuda: attention forward and backward", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const int64_t dh = GENERATE(16, 64, 128);
  Rng rng(302 + static_cast<uint64_t>(dh));
  for (const AttentionCase& c : attention_cases(rng)) {
    const int64_t B = static_cast<int64_t>(c.q_pos.size()), H = c.heads;
    const int64_t T = static_cast<int64_t>(c.q_pos[0].size());
    const int64_t S = static_cast<int64_t>(c.k_pos[0].size());
    const Tensor q_pos = pos_tensor(c.q_pos, c.pos_type), k_pos = pos_tensor(c.k_pos, c.pos_type);
    const Tensor q = rounded(normal({B, T, H, dh}, rng, 1.5), p.dtype);
    const Tensor k = rounded(normal({B, S, H, dh}, rng, 1.5), p.dtype);
    const Tensor v = rounded(normal({B, S, H, dh}, rng), p.dtype);
    const Tensor dout = normal({B, T, H, dh}, rng);
    Tensor o = Tensor::empty({B, T, H, dh}, DType::F64), lse = Tensor::empty({B, H, T}, DType::F64);
    cpu().attention_forward(q, k, v, q_pos, k_pos, o, lse);

    const bool can_share = c.q_pos == c.k_pos;
    for (bool shared : {true, false})
      for (bool lse_f32 : {false, true}) {
        if ((shared && !can_share) || (lse_f32 && p.dtype != DType::BF16)) continue;
        INFO(c.what << ", B " << B << ", H " << H << ", Dh " << dh << ", positions "
                    << dtype_name(c.pos_type) << "; "
                    << (shared ? "q_pos and k_pos one tensor" : "k_pos a separate tensor")
                    << (lse_f32 ? ", lse f32 beside bf16" : "")
                    << (shared && lse_f32 ? " (cuDNN where it applies)" : " (modtrain kernel)"));
        auto lse_arg = [&](Arg a) { return lse_f32 ? f32_when_bf16(std::move(a)) : a; };
        check_parity(
            p,
            {in("q", q), in("k", k), in("v", v), in("q_pos", q_pos), in("k_pos", k_pos),
             out("out", {B, T, H, dh}), lse_arg(out("lse", {B, H, T}))},
            [&](Backend& b, std::vector<Tensor>& t) {
              b.attention_forward(t[0], t[1], t[2], t[3], shared ? t[3] : t[4], t[5], t[6]);
            },
            Tol::Long);
        check_parity(
            p,
            {in("q", q), in("k", k), in("v", v), in("q_pos", q_pos), in("k_pos", k_pos),
             in("out", o), lse_arg(in("lse", lse)), in("dout", dout), out("dq", {B, T, H, dh}),
             out("dk", {B, S, H, dh}), out("dv", {B, S, H, dh})},
            [&](Backend& b, std::vector<Tensor>& t) {
              b.attention_backward(t[0], t[1], t[2], t[3], shared ? t[3] : t[4], t[5], t[6],
                                   t[7], t[8], t[9], t[10]);
            },
            // dq and dk are exactly zero where a query sees one key (T = S = 1): judged
            // against the inputs' scale, about 1, not their rms, which is rounding noise.
            Tol::Long, /*scale_floor=*/1.0);
      }
  }
}

TEST_CASE("cuda: gather_rows and scatter_add_rows with repeated indices", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType idx_type = GENERATE(DType::I32, DType::I64);
  Rng rng(303);
  struct Size {
    int64_t b, t, c, d;
    bool routed;  // sorted distinct rows, as MoD's top-k gives; else random with repeats
  };
  for (Size s :
       {Size{3, 50, 20, 70, false}, Size{2, 512, 64, 1024, true}, Size{1, 1, 1, 1, false}}) {
    INFO("B " << s.b << ", T " << s.t << ", C " << s.c << ", D " << s.d << ", idx "
              << dtype_name(idx_type) << (s.routed ? ", routed" : ", repeats"));
    std::vector<int64_t> idx;
    for (int64_t r = 0; r < s.b; ++r) {
      std::vector<int64_t> row = s.routed ? sorted_subset(s.c, s.t, rng) : std::vector<int64_t>{};
      if (!s.routed) {
        for (int64_t j = 0; j < s.c; ++j) row.push_back(rng.below(s.t));
        for (int64_t j = 1; j < std::min<int64_t>(s.c, 3); ++j) row[j] = row[0];  // a triple
      }
      idx.insert(idx.end(), row.begin(), row.end());
    }
    const Tensor idx_t = indices(idx, {s.b, s.c}, idx_type);
    check_parity(p,
                 {in("x", normal({s.b, s.t, s.d}, rng)), in("idx", idx_t),
                  out("out", {s.b, s.c, s.d})},
                 [](Backend& b, std::vector<Tensor>& t) { b.gather_rows(t[0], t[1], t[2]); });
    check_parity(p,
                 {in("idx", idx_t), in("src", normal({s.b, s.c, s.d}, rng)),
                  inout("out", normal({s.b, s.t, s.d}, rng))},
                 [](Backend& b, std::vector<Tensor>& t) { b.scatter_add_rows(t[0], t[1], t[2]); });
  }
}

// MoD's gate multiply, scatter and residual add in one pass, and its backward (the gathered
// rows times the gate, and the gate's row sums), with top-k's distinct sorted rows; D odd (no
// bf16 pairs), a routed width, and one row. dsrc or dgate alone as well as both.
TEST_CASE("cuda: scatter_gated_rows and its backward against the CPU", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType idx_type = GENERATE(DType::I32, DType::I64);
  Rng rng(307);
  struct Size {
    int64_t b, t, c, d;
  };
  for (Size s : {Size{3, 50, 20, 71}, Size{2, 512, 64, 768}, Size{1, 1, 1, 1}}) {
    INFO("B " << s.b << ", T " << s.t << ", C " << s.c << ", D " << s.d << ", idx "
              << dtype_name(idx_type));
    std::vector<int64_t> idx;
    for (int64_t r = 0; r < s.b; ++r) {
      const auto row = sorted_subset(s.c, s.t, rng);
      idx.insert(idx.end(), row.begin(), row.end());
    }
    const Tensor idx_t = indices(idx, {s.b, s.c}, idx_type);
    const Tensor src = normal({s.b, s.c, s.d}, rng), gate = normal({s.b, s.c, 1}, rng);
    check_parity(p,
                 {in("idx", idx_t), in("src", src), in("gate", gate),
                  inout("out", normal({s.b, s.t, s.d}, rng))},
                 [](Backend& b, std::vector<Tensor>& t) {
                   b.scatter_gated_rows(t[0], t[1], t[2], t[3]);
                 });
    const Tensor dout = normal({s.b, s.t, s.d}, rng);
    for (int want = 1; want <= 3; ++want) {  // bit 0: dsrc, bit 1: dgate
      INFO("dsrc " << (want & 1) << ", dgate " << (want >> 1));
      check_parity(p,
                   {in("dout", dout), in("idx", idx_t), in("src", src), in("gate", gate),
                    inout("dsrc", normal({s.b, s.c, s.d}, rng)),  // left alone when unwanted
                    inout("dgate", normal({s.b, s.c, 1}, rng))},
                   [want](Backend& b, std::vector<Tensor>& t) {
                     Tensor none_src, none_gate;
                     b.scatter_gated_rows_backward(t[0], t[1], t[2], t[3],
                                                   (want & 1) ? t[4] : none_src,
                                                   (want & 2) ? t[5] : none_gate);
                   },
                   Tol::Long);
    }
  }
}

// An MoE's combine and its gather's backward: 8 experts' runs of 512 distinct tokens of 2048,
// repeats across runs. In runs, every address gets one add per launch, in run order: the CPU's
// order, so f64 and f32 match bit for bit (one pass would add repeats in any order).
TEST_CASE("cuda: scatter_add_rows and gather_rows' backward in runs add in the CPU's order",
          "[cuda]") {
  const DType dtype = GENERATE(DType::F64, DType::F32);
  Rng rng(306);
  const int64_t runs = 8, len = 512, t = 2048, d = 96;
  std::vector<int64_t> idx;
  for (int64_t r = 0; r < runs; ++r) {
    const auto run = sorted_subset(len, t, rng);
    idx.insert(idx.end(), run.begin(), run.end());
  }
  const Tensor idx_cpu = indices(idx, {1, runs * len});
  const Tensor idx_gpu = idx_cpu.to(Device::CUDA);
  const Tensor x = normal({1, t, d}, rng), src = normal({1, runs * len, d}, rng);
  const Tensor seed = normal({1, runs * len, d}, rng);
  INFO(dtype_name(dtype));
  expect_equal("scatter_add_rows in runs",
               scatter_add_rows(to_gpu(x, dtype), idx_gpu, to_gpu(src, dtype), runs).to(Device::CPU),
               scatter_add_rows(x.to(dtype), idx_cpu, src.to(dtype), runs));
  auto gather_grad = [&](const Tensor& xv, const Tensor& idxv, const Tensor& seedv) {
    Tensor leaf = xv.clone().set_requires_grad(true);
    gather_rows(leaf, idxv, runs).backward(seedv);
    return leaf.grad().to(Device::CPU);
  };
  expect_equal("gather_rows' backward in runs",
               gather_grad(to_gpu(x, dtype), idx_gpu, to_gpu(seed, dtype)),
               gather_grad(x.to(dtype), idx_cpu, seed.to(dtype)));
}

// Indices must match exactly: k largest per row, ascending by position, ties to the lower
// position. In bf16 the normal scores collide after rounding, so that case has ties as well.
TEST_CASE("cuda: topk_rows with ties, k = 1, T/8 and T", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(304);
  struct Case {
    std::string what;
    Tensor scores;
  };
  std::vector<Case> cases;
  auto integers = [&](int64_t b, int64_t t, int64_t levels) {
    Tensor s = Tensor::empty({b, t}, DType::F64);
    for (int64_t i = 0; i < s.numel(); ++i) s.set(i, static_cast<double>(rng.below(levels)));
    return s;
  };
  cases.push_back({"4 levels over T = 64 (many ties)", integers(4, 64, 4)});
  cases.push_back({"10 levels over T = 1000", integers(3, 1000, 10)});
  cases.push_back({"one constant row (all tied: the first k win)", Tensor::full({1, 300}, 0.25,
                                                                                DType::F64)});
  cases.push_back({"normal scores over T = 4096", normal({2, 4096}, rng)});
  Tensor zeros = integers(1, 64, 3);  // -1, 0, 1 with the zeros' signs mixed: -0 == +0 ties
  for (int64_t i = 0; i < zeros.numel(); ++i) {
    const double x = zeros.at(i) - 1.0;
    zeros.set(i, x == 0.0 && i % 2 ? -0.0 : x);
  }
  cases.push_back({"signed zeros (-0 == +0, so position breaks the tie)", zeros});
  Tensor with_nan = integers(2, 200, 5);  // NaN ranks below every number, -inf included
  for (int64_t i = 0; i < with_nan.numel(); i += 3)
    with_nan.set(i, i % 2 ? std::numeric_limits<double>::quiet_NaN() : -1.0 / 0.0);
  cases.push_back({"NaN and -inf scores (NaN last, tied by position)", with_nan});
  for (const Case& c : cases) {
    const int64_t t = c.scores.size(1);
    for (int64_t k : {int64_t{1}, t / 8, t}) {
      INFO(c.what << ", B " << c.scores.size(0) << ", k " << k);
      check_parity(p, {in("scores", c.scores), out("idx", {c.scores.size(0), k}, DType::I64)},
                   [k](Backend& b, std::vector<Tensor>& tt) { b.topk_rows(tt[0], k, tt[1]); });
    }
  }
}

// The inputs rounded to the dtype under test; the CPU reduces their exact values in f64, so
// counts, extremes and histogram buckets must match exactly (the bounds are the same fma on both
// sides) and the sums up to their order. T = 1000 and 12 leave the position buckets uneven.
TEST_CASE("cuda: routing_summary against the CPU", "[cuda]") {
  const DType dtype = GENERATE(MOD_PARITY_DTYPES);
  Rng rng(212);
  struct Case {
    int64_t rows, t;
    bool constant;
  };
  for (Case c : {Case{3, 1000, false}, Case{64, 1024, false}, Case{5, 12, false},
                 Case{2, 64, true}}) {
    INFO("R " << c.rows << ", T " << c.t << (c.constant ? ", constant r" : "") << ", "
              << dtype_name(dtype));
    const Shape shape{c.rows, c.t};
    const Tensor r = rounded(c.constant ? Tensor::full(shape, 0.75, DType::F64)
                                        : normal(shape, rng, 2.0),
                             dtype)
                         .to(DType::F64);
    const Tensor decision = rounded(normal(shape, rng), dtype).to(DType::F64);
    Tensor member = Tensor::zeros(shape, DType::F64);
    for (int64_t i = 0; i < member.numel(); ++i) member.set(i, rng.below(8) == 0 ? 1.0 : 0.0);
    Tensor want = Tensor::empty({RoutingSummary::kSize}, DType::F64);
    cpu().routing_summary(r, decision, member, want);
    Tensor got = Tensor::empty({RoutingSummary::kSize}, DType::F64, Device::CUDA);
    gpu().routing_summary(to_gpu(r, dtype), to_gpu(decision, dtype), to_gpu(member, dtype), got);
    const std::vector<double> g = got.to(Device::CPU).to_vector(), w = want.to_vector();
    for (int k = 0; k < RoutingSummary::kSize; ++k) {
      INFO("entry " << k);
      if (k == RoutingSummary::kSum || k == RoutingSummary::kSumSquares)
        CHECK(g[k] == Approx(w[k]).epsilon(1e-12).margin(1e-9));
      else
        CHECK(g[k] == w[k]);
    }
  }
}

// MoE slot selection: expert choice with and without a no-op expert, token choice top 1 and 2
// (which drops), on probabilities with many ties (integer levels) and on normal ones; every
// output must equal the CPU's exactly (selections are comparisons, and comparisons of values
// rounded to the dtype under test agree in every dtype).
TEST_CASE("cuda: moe_select, expert and token choice", "[cuda]") {
  const DType dtype = GENERATE(MOD_PARITY_DTYPES);
  Rng rng(305);
  struct Case {
    std::string what;
    MoeSelectArgs args;
    int64_t e_all;
  };
  MoeSelectArgs ec{false, 4, 0, 6, 1}, noop{false, 4, 12, 3, 1}, tc1{true, 4, 0, 5, 1},
      tc2{true, 4, 0, 7, 2};
  const std::vector<Case> cases = {{"expert choice", ec, 4}, {"expert choice + no-op", noop, 5},
                                   {"token choice top 1", tc1, 4}, {"token choice top 2", tc2, 4}};
  const int64_t b = 3, t = 24;
  for (const Case& c : cases) {
    for (bool ties : {true, false}) {
      INFO(c.what << (ties ? ", tied levels" : ", normal") << ", " << dtype_name(dtype));
      Tensor probs = Tensor::empty({b, t, c.e_all}, DType::F64);
      for (int64_t i = 0; i < probs.numel(); ++i)
        probs.set(i, ties ? static_cast<double>(rng.below(4)) / 4 : rng.normal());
      probs = rounded(probs, dtype).to(DType::F64);
      const int64_t n = c.args.experts * b * c.args.k;
      const DType share_dtype = dtype == DType::BF16 ? DType::F32 : dtype;
      Tensor rows = Tensor::empty({n}, DType::I64), gates = Tensor::empty({n}, DType::I64),
             valid = Tensor::empty({n}, DType::F64), share = Tensor::empty({b, c.args.experts}, DType::F64),
             counts = Tensor::empty({b, 2}, DType::F64);
      cpu().moe_select(probs, c.args, rows, gates, valid, share, counts);
      Tensor g_rows = Tensor::empty({n}, DType::I64, Device::CUDA),
             g_gates = Tensor::empty({n}, DType::I64, Device::CUDA),
             g_valid = Tensor::empty({n}, dtype, Device::CUDA),
             g_share = Tensor::empty({b, c.args.experts}, share_dtype, Device::CUDA),
             g_counts = Tensor::empty({b, 2}, DType::F64, Device::CUDA);
      gpu().moe_select(to_gpu(probs, dtype), c.args, g_rows, g_gates, g_valid, g_share, g_counts);
      CHECK(g_rows.to(Device::CPU).to_vector() == rows.to_vector());
      CHECK(g_gates.to(Device::CPU).to_vector() == gates.to_vector());
      CHECK(g_valid.to(Device::CPU).to(DType::F64).to_vector() == valid.to_vector());
      CHECK(g_counts.to(Device::CPU).to_vector() == counts.to_vector());
      CHECK(g_share.to(Device::CPU).to(DType::F64).to_vector() ==
            share.to(share_dtype).to(DType::F64).to_vector());
    }
  }
}
