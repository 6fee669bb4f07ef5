// The decode family (core/ops/decode.h) against references: decode_attention against the fused
// attention op on each sequence's cached prefix, the masked cache append and residual add,
// sample_tokens' rules (greedy ties, top-k and top-p sets, draw frequencies, the Philox stream's
// known answers), decode_advance's bookkeeping, and argument errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "core/all_ops.h"
#include "core/philox.h"
#include "core/random.h"

using namespace mod;
using Catch::Matchers::Contains;

namespace {
Tensor vec(const std::vector<int64_t>& v) {
  return Tensor::from_indices(v, {static_cast<int64_t>(v.size())});
}
std::vector<int64_t> ints(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}
}  // namespace

TEST_CASE("philox4x32-10 gives Random123's known answers", "[forward][decode]") {
  const Philox4x32 zero = philox4x32(Philox4x32{{0, 0, 0, 0}}, 0, 0);
  CHECK(zero.v[0] == 0x6627e8d5u);
  CHECK(zero.v[1] == 0xe169c58du);
  CHECK(zero.v[2] == 0xbc57ac4cu);
  CHECK(zero.v[3] == 0x9b00dbd8u);
  const uint32_t f = 0xffffffffu;
  const Philox4x32 ones = philox4x32(Philox4x32{{f, f, f, f}}, f, f);
  CHECK(ones.v[0] == 0x408f276du);
  CHECK(ones.v[1] == 0x41c83b0eu);
  CHECK(ones.v[2] == 0xa20bc7c6u);
  CHECK(ones.v[3] == 0x6d5451fdu);
  // Uniforms in [0, 1), different per stream and per position.
  CHECK(philox_uniform(1, 0, 5) != philox_uniform(1, 1, 5));
  CHECK(philox_uniform(1, 0, 5) != philox_uniform(1, 0, 6));
  CHECK(philox_uniform(1, 0, 5) != philox_uniform(2, 0, 5));
  for (uint64_t i = 0; i < 1000; ++i) {
    const double u = philox_uniform(3, i, i * 7);
    REQUIRE(u >= 0);
    REQUIRE(u < 1);
  }
}

TEST_CASE("decode_attention equals the fused attention over each sequence's cached prefix",
          "[forward][decode]") {
  Rng rng(3);
  const int64_t b_n = 3, s = 9, h = 2, dh = 8;
  for (DType dtype : {DType::F32, DType::F64}) {
    const Tensor q = randn({b_n, 1, h, dh}, rng, dtype);
    const Tensor kc = randn({b_n, s, h, dh}, rng, dtype), vc = randn({b_n, s, h, dh}, rng, dtype);
    const std::vector<int64_t> lens = {4, 0, 9};
    const Tensor out = decode_attention(q, kc, vc, vec(lens));
    REQUIRE(out.shape() == q.shape());
    for (int64_t b = 0; b < b_n; ++b) {
      INFO("sequence " << b << ", " << dtype_name(dtype));
      const int64_t n = lens[b];
      const Tensor got = out.narrow0(b, 1);
      if (n == 0) {
        for (double x : got.to_vector()) CHECK(x == 0);
        continue;
      }
      std::vector<int64_t> kp(n);
      for (int64_t j = 0; j < n; ++j) kp[j] = j;
      const Tensor k = kc.narrow0(b, 1).clone().view({s, h, dh}).narrow0(0, n).clone();
      const Tensor v = vc.narrow0(b, 1).clone().view({s, h, dh}).narrow0(0, n).clone();
      const Tensor want = attention(q.narrow0(b, 1).clone(), k.view({1, n, h, dh}),
                                    v.view({1, n, h, dh}), Tensor::from_indices({n - 1}, {1, 1}),
                                    Tensor::from_indices(kp, {1, n}));
      const auto a = got.to_vector(), w = want.to_vector();
      for (size_t i = 0; i < a.size(); ++i)
        CHECK(a[i] == Approx(w[i]).margin(dtype == DType::F32 ? 1e-5 : 1e-12));
    }
    // Gathered rows name their sequences: rows {2, 0} give sequence 2's and 0's results.
    const Tensor q2 = Tensor::empty({2, 1, h, dh}, dtype);
    q2.narrow0(0, 1).copy_from(q.narrow0(2, 1));
    q2.narrow0(1, 1).copy_from(q.narrow0(0, 1));
    const Tensor out2 = decode_attention(q2, kc, vc, vec(lens), vec({2, 0}));
    CHECK(out2.narrow0(0, 1).to_vector() == out.narrow0(2, 1).to_vector());
    CHECK(out2.narrow0(1, 1).to_vector() == out.narrow0(0, 1).to_vector());
  }
}

TEST_CASE("kv_cache_append writes admitted sequences only, at their own lengths",
          "[forward][decode]") {
  const int64_t b_n = 3, s = 2, h = 1, dh = 2;
  Tensor kc = Tensor::zeros({b_n, s, h, dh}), vc = Tensor::zeros({b_n, s, h, dh});
  Tensor len = vec({0, 1, 2});
  const Tensor k = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {b_n, 1, h, dh});
  const Tensor v = Tensor::from_vector({-1, -2, -3, -4, -5, -6}, {b_n, 1, h, dh});
  kv_cache_append(k, v, vec({1, 0, 1}), len, kc, vc);  // sequence 2 is full: nothing written
  CHECK(ints(len) == std::vector<int64_t>{1, 1, 2});
  CHECK(kc.to_vector() == std::vector<double>{1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  CHECK(vc.to_vector() == std::vector<double>{-1, -2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  kv_cache_append(k, v, Tensor(), len, kc, vc);  // no mask: every sequence with room
  CHECK(ints(len) == std::vector<int64_t>{2, 2, 2});
  CHECK(kc.to_vector() == std::vector<double>{1, 2, 1, 2, 0, 0, 3, 4, 0, 0, 0, 0});
  // Gathered rows: row 0 is sequence 1, row 1 sequence 0.
  Tensor kc2 = Tensor::zeros({b_n, s, h, dh}), vc2 = Tensor::zeros({b_n, s, h, dh});
  Tensor len2 = vec({0, 1, 0});
  const Tensor k2 = Tensor::from_vector({7, 8, 9, 10}, {2, 1, h, dh});
  kv_cache_append(k2, k2, Tensor(), len2, kc2, vc2, vec({1, 0}));
  CHECK(ints(len2) == std::vector<int64_t>{1, 2, 0});
  CHECK(kc2.to_vector() == std::vector<double>{9, 10, 0, 0, 0, 0, 7, 8, 0, 0, 0, 0});
}

TEST_CASE("decode_admit and masked_add follow the admitted sequences", "[forward][decode]") {
  // (Not {1, 1, 1, 0}: GCC 12.2 at -O2 and above with AVX-512 copies that list's last entry
  // wrong.)
  const Tensor decision = Tensor::from_vector({0.5, 2.0, 0.0, -0.1}, {4});
  CHECK(ints(decode_admit(decision, vec({1, 0, 1, 1}))) == std::vector<int64_t>{1, 0, 0, 0});
  const Tensor x = Tensor::from_vector({1, 2, 3, 4}, {2, 1, 2});
  const Tensor u = Tensor::from_vector({10, 20, 30, 40}, {2, 1, 2});
  CHECK(masked_add(x, u, vec({0, 1})).to_vector() == std::vector<double>{1, 2, 33, 44});
}

TEST_CASE("sample_tokens: greedy ties, top-k and top-p sets, and draw frequencies",
          "[forward][decode]") {
  SampleArgs greedy;
  greedy.temperature = 0;
  const Tensor tied = Tensor::from_vector({0, 3, 1, 3, 3, 2, 0, 0}, {2, 4});
  CHECK(ints(sample_tokens(tied, vec({0, 0}), greedy)) == std::vector<int64_t>{1, 0});

  // probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1
  const std::vector<double> p = {0.05, 0.5, 0.15, 0.3};
  std::vector<double> l;
  for (double x : p) l.push_back(std::log(x));
  const int64_t draws = 20000;
  std::vector<double> rows;
  for (int64_t i = 0; i < draws; ++i) rows.insert(rows.end(), l.begin(), l.end());
  const Tensor logits = Tensor::from_vector(rows, {draws, 4});
  std::vector<int64_t> pos(draws, 17);
  auto counts = [&](const SampleArgs& a) {
    const std::vector<int64_t> got = ints(sample_tokens(logits, vec(pos), a));
    std::vector<int64_t> n(4, 0);
    for (int64_t t : got) ++n[t];
    return n;
  };
  auto frequencies = [&](const SampleArgs& a) {
    std::vector<double> f;
    for (int64_t n : counts(a)) f.push_back(static_cast<double>(n) / draws);
    return f;
  };
  SampleArgs all;
  all.seed = 5;
  const auto f_all = frequencies(all);  // each row its own stream
  for (int i = 0; i < 4; ++i) CHECK(f_all[i] == Approx(p[i]).margin(0.015));
  SampleArgs k2 = all;
  k2.top_k = 2;  // ids 1 and 3: 0.5 / 0.8 and 0.3 / 0.8
  const auto f_k2 = frequencies(k2);
  CHECK(f_k2[0] == 0);
  CHECK(f_k2[2] == 0);
  CHECK(f_k2[1] == Approx(0.625).margin(0.015));
  SampleArgs p7 = all;
  p7.top_p = 0.7;  // 0.5 + 0.3 reaches 0.7: the same set
  CHECK(counts(p7) == counts(k2));
  SampleArgs p4 = all;
  p4.top_p = 0.4;  // 0.5 alone reaches it: always id 1, as top_k 1 and greedy
  CHECK(counts(p4) == std::vector<int64_t>{0, draws, 0, 0});
  SampleArgs k1 = all;
  k1.top_k = 1;
  CHECK(counts(k1) == std::vector<int64_t>{0, draws, 0, 0});
  SampleArgs hot = all;
  hot.temperature = 2;  // p^(1/2), renormalised
  double z = 0;
  for (double x : p) z += std::sqrt(x);
  const auto f_hot = frequencies(hot);
  for (int i = 0; i < 4; ++i) CHECK(f_hot[i] == Approx(std::sqrt(p[i]) / z).margin(0.015));
  // A row's draw depends on (seed, stream, position) only: the same row again, alone, with
  // first_stream pointing at it, draws the same token.
  const std::vector<int64_t> batch = ints(sample_tokens(logits.narrow0(0, 8), vec(std::vector<int64_t>(8, 17)), all));
  for (int64_t r = 0; r < 8; ++r) {
    SampleArgs alone = all;
    alone.first_stream = r;
    CHECK(ints(sample_tokens(logits.narrow0(r, 1), vec({17}), alone))[0] == batch[r]);
  }
}

TEST_CASE("decode_advance feeds the prompt, then the draws, and ends sequences", "[forward][decode]") {
  // Sequence 0: prompt of 3, stop 4; sequence 1: prompt of 1, stop 3, eot 9.
  Tensor tokens = Tensor::from_indices({5, 6, 7, 0, 0, 8, 0, 0, 0, 0}, {2, 5});
  const Tensor plen = vec({3, 1}), stop = vec({4, 3});
  Tensor pos = vec({0, 0}), cur = vec({5, 8}), active = vec({1, 1});
  decode_advance(vec({1, 2}), plen, stop, 9, tokens, pos, cur, active);
  CHECK(ints(cur) == std::vector<int64_t>{6, 2});  // the prompt's token; the draw
  CHECK(ints(pos) == std::vector<int64_t>{1, 1});
  CHECK(ints(active) == std::vector<int64_t>{1, 1});
  decode_advance(vec({3, 9}), plen, stop, 9, tokens, pos, cur, active);
  CHECK(ints(cur) == std::vector<int64_t>{7, 9});
  CHECK(ints(active) == std::vector<int64_t>{1, 0});  // a generated eot ends sequence 1
  decode_advance(vec({4, 4}), plen, stop, 9, tokens, pos, cur, active);
  decode_advance(vec({5, 5}), plen, stop, 9, tokens, pos, cur, active);
  CHECK(ints(active) == std::vector<int64_t>{0, 0});  // sequence 0 reached its stop
  CHECK(ints(tokens) == std::vector<int64_t>{5, 6, 7, 4, 5, 8, 2, 9, 4, 5});
}

// A row of logits with a NaN or an infinity used to be sampled anyway: greedy took the argmax
// of NaN, a temperature draw fed -1 back to the embedding. Its token is the marker, the
// sequence stops there, and its current token stays a real id for the masked steps after.
TEST_CASE("non-finite logits give the marker token and stop only their sequence",
          "[forward][decode]") {
  Tensor logits = Tensor::zeros({3, 5});
  logits.data<float>()[0 * 5 + 1] = 2.0f;
  logits.data<float>()[1 * 5 + 3] = std::nanf("");
  logits.data<float>()[2 * 5 + 0] = INFINITY;
  for (const double temperature : {0.0, 1.0}) {
    INFO("temperature " << temperature);
    SampleArgs a;
    a.temperature = temperature;
    const std::vector<int64_t> next = ints(sample_tokens(logits, vec({4, 4, 4}), a));
    CHECK(next[0] >= 0);
    CHECK(next[1] == kNonFiniteLogitsToken);
    CHECK(next[2] == kNonFiniteLogitsToken);
  }
  Tensor tokens = Tensor::from_indices({5, 0, 0, 6, 0, 0}, {2, 3});
  Tensor pos = vec({0, 0}), cur = vec({5, 6}), active = vec({1, 1});
  decode_advance(vec({kNonFiniteLogitsToken, 2}), vec({1, 1}), vec({2, 2}), -1, tokens, pos, cur,
                 active);
  CHECK(ints(tokens) == std::vector<int64_t>{5, kNonFiniteLogitsToken, 0, 6, 2, 0});
  CHECK(ints(active) == std::vector<int64_t>{0, 1});
  CHECK(ints(cur) == std::vector<int64_t>{5, 2});  // an id the embedding takes
  CHECK(ints(pos) == std::vector<int64_t>{1, 1});
}

TEST_CASE("decode ops name the bad argument", "[forward][decode]") {
  const Tensor kc = Tensor::zeros({2, 4, 1, 2}), q = Tensor::zeros({2, 1, 1, 2});
  CHECK_THROWS_WITH(decode_attention(q, kc, kc, Tensor::zeros({2})),
                    Contains("len f32[2] on cpu must be i64 with 2 entries"));
  CHECK_THROWS_WITH(decode_attention(Tensor::zeros({2, 1, 2, 2}), kc, kc, vec({0, 0})),
                    Contains("q [2, 1, 2, 2] must be [N,1,H,Dh]"));
  CHECK_THROWS_WITH(decode_attention(q, kc, kc, vec({0, 0}), vec({0, 2})),
                    Contains("rows[1] = 2 is out of range [0, 2)"));
  Tensor len = vec({0});
  Tensor k = kc;
  CHECK_THROWS_WITH(kv_cache_append(q, q, Tensor(), len, k, k), Contains("len"));
  SampleArgs a;
  a.top_p = 0;
  CHECK_THROWS_WITH(sample_tokens(Tensor::zeros({1, 3}), vec({0}), a), Contains("top_p"));
}
