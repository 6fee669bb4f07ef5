#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include "core/model/transformer.h"
#include "core/ops.h"
#include "tests/model/tiny_configs.h"
using namespace mod; using namespace mod::model;
TEST_CASE("debug fd", "[.debug]") {
  auto cfg = test::tiny_moe(true, false);
  cfg.set_vocab_size(16); cfg.set_d_model(8); cfg.set_d_ff(8); cfg.set_seq_len(8); cfg.set_init_std(0.5);
  cfg.mutable_moe()->set_n_experts(2); cfg.mutable_moe()->set_z_weight(0.1);
  Transformer m(cfg, 23, DType::F64);
  Rng rng(24); std::vector<int64_t> a;
  for (int r = 0; r < 2; ++r) { std::vector<int64_t> perm(16); for (int i = 0; i < 16; ++i) perm[i] = i;
    for (int64_t i = 15; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]); a.insert(a.end(), perm.begin(), perm.begin() + 8); }
  std::vector<int64_t> b(16); Rng rng2(25); for (auto& i : b) i = rng2.below(16);
  Tensor tok = Tensor::from_indices(a, {2, 8}), tgt = Tensor::from_indices(b, {2, 8});
  for (auto v : a) std::printf("%lld ", (long long)v); std::printf("\n");
  Tensor w = m.parameter("embed.weight");
  const double orig = w.at(115);
  NoGradGuard g;
  for (double h : {-1e-3, -1e-4, -1e-5, -1e-6, -1e-7, 0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3}) {
    w.set(115, orig + h);
    auto r = m.forward(tok, tgt);
    std::printf("h %+.0e loss %.12f lm %.12f aux %.12f unrouted %.4f %.4f idx", h, r.loss.item(), r.lm_loss.item(), r.aux_loss.item(),
                r.moe_stats[0].unrouted_fraction, r.moe_stats[1].unrouted_fraction);
    for (auto v : r.routed_idx[0].to_vector()) std::printf(" %g", v);
    std::printf("\n");
  }
  w.set(115, orig);
  auto cfg2 = test::tiny_moe(false); cfg2.mutable_moe()->set_d_expert(8);
  Rng r3(1); MoeMlp layer(cfg2, r3, DType::F64); Tensor x = randn({2, 8, 16}, r3, DType::F64);
  auto timeit = [&](const char* name, std::function<void()> f) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) f();
    auto t1 = std::chrono::steady_clock::now();
    std::printf("%s %.1f us\n", name, std::chrono::duration<double, std::micro>(t1 - t0).count() / 200);
  };
  timeit("moe forward", [&] { layer.forward(x); });
  Tensor xs = randn({4, 4, 16}, r3, DType::F64);
  timeit("experts", [&] { layer.experts().forward(xs); });
  Tensor wu = layer.parameter("experts.up");
  timeit("bmm nt", [&] { matmul(xs, wu, false, true); });
  Tensor x32 = xs.to(DType::F32), w32 = wu.to(DType::F32);
  timeit("bmm nt f32", [&] { matmul(x32, w32, false, true); });
  Tensor h = randn({4, 4, 8}, r3, DType::F64); Tensor dw = layer.parameter("experts.down");
  timeit("gelu", [&] { gelu(h); });
  timeit("bmm2", [&] { matmul(h, dw, false, true); });
  Tensor hh = matmul(xs, wu, false, true);
  timeit("gelu(hh)", [&] { gelu(hh); });
  timeit("bmm2 hh", [&] { matmul(gelu(hh), dw, false, true); });
  Tensor rw = layer.parameter("router.weight");
  timeit("router", [&] { matmul(x, rw, false, true); });
  timeit("softmax", [&] { softmax(x); });
  Tensor p = softmax(randn({2,8,4}, r3, DType::F64));
  timeit("expert_choice", [&] { expert_choice(p, cfg2.moe()); });
}
