// ops_bench: every op family checked against a naive reference, then timed, with its rate
// printed next to the machine's ceilings measured in the same run (SGEMM rate, memory
// bandwidth). Targets: GEMM-backed ops >= 90% of raw BLAS; fused attention fwd+bwd >= 50% of
// the GEMM rate; norms, elementwise and gather/scatter >= 60% of memory bandwidth.
//
// Memory-bound kernels are timed through the backend with preallocated outputs (the kernel
// alone); matmul is timed as the public op, allocation included, against raw BLAS.
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/all_ops.h"
#include "core/backend.h"
#include "core/cpu/blas.h"
#include "core/device_report.h"
#include "core/ops/optim.h"
#include "core/random.h"
#include "tests/reference/naive_ops.h"

using namespace mod;
namespace ref = mod::reference;

namespace {

// Best wall time of fn over repeated calls totalling at least min_seconds; `before` runs
// untimed ahead of each call.
double best_seconds(const std::function<void()>& fn, double min_seconds = 0.3,
                    const std::function<void()>& before = {}) {
  fn();  // warm-up: page faults, BLAS initialisation
  double best = 1e30, total = 0;
  int reps = 0;
  while (total < min_seconds || reps < 3) {
    if (before) before();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
    ++reps;
  }
  return best;
}

// Writes 64 MB, more than the L2 and L3 caches of the hosts we run on hold.
void evict_caches() {
  static std::vector<float> junk(int64_t{16} << 20);
  static float v = 0;
  v += 1;
  std::fill(junk.begin(), junk.end(), v);
}

std::vector<double> values(const Tensor& t) { return t.to_vector(); }
std::vector<int64_t> indices(const Tensor& t) {
  std::vector<int64_t> out(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = static_cast<int64_t>(t.at(i));
  return out;
}
double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct Ceilings {
  double gemm_gflops = 0, bandwidth_gbs = 0;
};

int g_misses = 0;

void check(const char* name, double err, double tol) {
  const bool ok = err <= tol;
  std::printf("  check %-28s max|err| %.2e (tol %.0e) %s\n", name, err, tol, ok ? "ok" : "WRONG");
  if (!ok) {
    std::fprintf(stderr, "ops_bench: %s disagrees with the naive reference\n", name);
    std::exit(1);
  }
}

// One result line: rate, ceiling, fraction, and the target verdict when there is one.
void report(const char* name, double rate, const char* unit, double ceiling, double target) {
  const double frac = rate / ceiling;
  const bool has_target = target > 0;
  if (has_target && frac < target) ++g_misses;
  std::printf("  %-34s %8.1f %-6s %5.0f%% of %7.1f%s\n", name, rate, unit, 100 * frac, ceiling,
              has_target ? (frac >= target ? "  target met" : "  BELOW TARGET") : "");
}

Ceilings measure_ceilings() {
  Ceilings c;
  {  // memory bandwidth: triad over arrays far larger than the last-level cache
    const int64_t n = int64_t{1} << 26;  // 256 MB per array
    std::vector<float> a(n, 1.0f), b(n, 2.0f), d(n, 0.0f);
    const double s = best_seconds([&] {
#pragma omp parallel for simd
      for (int64_t i = 0; i < n; ++i) d[i] = a[i] + 0.5f * b[i];
    });
    c.bandwidth_gbs = 3.0 * 4 * n / s / 1e9;
  }
  {  // SGEMM: the linear-layer shape [4096,768] x [3072,768]^T
    const int64_t m = 4096, n = 3072, k = 768;
    std::vector<float> a(m * k, 0.5f), b(n * k, 0.25f), out(m * n);
    const double s = best_seconds([&] {
      cpu::blas_gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, out.data(), n);
    });
    c.gemm_gflops = 2.0 * m * n * k / s / 1e9;
  }
  return c;
}

// One GEMM of a training step, as blas_gemm sees it, and how often a step runs it.
struct StepGemm {
  bool ta, tb;
  int64_t m, n, k;
  int calls;
};

// A dense step's GEMMs over `tokens`: for every linear layer the forward x W^T, the input
// gradient dY W and the weight gradient dY^T X (Q, K, V and O; the MLP's up and down; the output
// layer).
std::vector<StepGemm> step_gemms(int64_t d, int64_t ff, int64_t vocab, int64_t tokens, int layers) {
  std::vector<StepGemm> gemms;
  const auto linear = [&](int64_t in, int64_t out, int calls) {
    gemms.push_back({false, true, tokens, out, in, calls});
    gemms.push_back({false, false, tokens, in, out, calls});
    gemms.push_back({true, false, out, in, tokens, calls});
  };
  linear(d, d, 4 * layers);
  linear(d, ff, layers);
  linear(ff, d, layers);
  linear(d, vocab, 1);
  return gemms;
}

// The rate a step's GEMMs can reach here: each shape timed alone with caches warm and cold (in
// a step most operands, saved activations and weights, were written long before), the mix
// weighted by calls, against a 1024^3 SGEMM timed warm alongside.
void bench_step_gemms(const char* model, const std::vector<StepGemm>& gemms) {
  std::vector<float> a, b, out;
  const auto time_one = [&](const StepGemm& g, bool cold) {
    a.assign(g.m * g.k, 0.5f);
    b.assign(g.k * g.n, 0.25f);
    out.assign(g.m * g.n, 0.0f);
    return best_seconds(
        [&] {
          cpu::blas_gemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), g.ta ? g.m : g.k, b.data(),
                         g.tb ? g.k : g.n, 0.0f, out.data(), g.n);
        },
        0.3, cold ? std::function<void()>(evict_caches) : std::function<void()>());
  };
  const double sgemm =
      2.0 * 1024 * 1024 * 1024 / time_one({false, false, 1024, 1024, 1024, 1}, false) / 1e9;
  double flops = 0, warm = 0, cold = 0;
  for (const StepGemm& g : gemms) {
    const double f = 2.0 * g.m * g.n * g.k, tw = time_one(g, false), tc = time_one(g, true);
    flops += g.calls * f;
    warm += g.calls * tw;
    cold += g.calls * tc;
    std::printf("    %c%c %5ldx%5ldx%5ld x%-3d warm %6.1f  cold %6.1f GF/s\n", g.ta ? 'T' : 'N',
                g.tb ? 'T' : 'N', static_cast<long>(g.m), static_cast<long>(g.n),
                static_cast<long>(g.k), g.calls, f / tw / 1e9, f / tc / 1e9);
  }
  const std::string name = std::string("GEMMs of a ") + model + " step, warm";
  report(name.c_str(), flops / warm / 1e9, "GF/s", sgemm, 0);
  report("  caches cold", flops / cold / 1e9, "GF/s", sgemm, 0);
}

void bench_matmul(const Ceilings& c, Rng& rng) {
  std::printf("\nmatmul (GEMM-backed; target >= 90%% of raw BLAS on the same shapes)\n");
  {
    Tensor a = randn({37, 53}, rng), w = randn({29, 53}, rng);
    check("linear [37,53]x[29,53]^T", max_abs_diff(values(linear(a, w)),
                                                   ref::matmul_nt(values(a), values(w), 37, 29, 53)),
          1e-3);
  }
  const int64_t m = 4096, n = 3072, k = 768;
  Tensor x = randn({8, 512, k}, rng), w = randn({n, k}, rng).set_requires_grad(true);
  x.set_requires_grad(true);
  std::vector<float> dy(m * n, 0.1f), dx(m * k), dw(n * k), y(m * n);
  const float* px = x.data<float>();
  const float* pw = w.data<float>();
  const double raw_fwd = best_seconds([&] {
    cpu::blas_gemm(false, true, m, n, k, 1.0f, px, k, pw, k, 0.0f, y.data(), n);
  });
  const double raw_bwd = best_seconds([&] {
    cpu::blas_gemm(false, false, m, k, n, 1.0f, dy.data(), n, pw, k, 0.0f, dx.data(), k);
    cpu::blas_gemm(true, false, n, k, m, 1.0f, dy.data(), n, px, k, 0.0f, dw.data(), k);
  });
  const double op_fwd = best_seconds([&] {
    NoGradGuard g;
    linear(x, w);
  });
  Tensor seed = Tensor::full({8, 512, n}, 0.1);
  const double op_both = best_seconds([&] {
    x.zero_grad();
    w.zero_grad();
    linear(x, w).backward(seed);
  });
  const double flops = 2.0 * m * n * k;
  report("linear fwd [4096,768]x[3072,768]^T", flops / op_fwd / 1e9, "GF/s", flops / raw_fwd / 1e9,
         0.9);
  report("linear fwd+bwd (3 GEMMs)", 3 * flops / op_both / 1e9, "GF/s",
         3 * flops / (raw_fwd + raw_bwd) / 1e9, 0.9);
  std::printf("  (raw BLAS here: %.1f GF/s fwd; ceiling measured above: %.1f GF/s)\n",
              flops / raw_fwd / 1e9, c.gemm_gflops);
  std::printf(
      "  a dense step's GEMMs against a 1024^3 SGEMM timed with them (docs/performance.md)\n");
  bench_step_gemms("tiny", step_gemms(256, 1024, 256, 2048, 6));
  bench_step_gemms("GPT-2-small-like", step_gemms(512, 2048, 8192, 2048, 8));
}

void bench_attention(const Ceilings& c, Rng& rng) {
  std::printf("\nattention (flash-style fused; target fwd+bwd >= 50%% of the SGEMM rate)\n");
  {
    const int64_t b = 2, t = 37, h = 3, dh = 16;
    Tensor q = randn({b, t, h, dh}, rng), k = randn({b, t, h, dh}, rng),
           v = randn({b, t, h, dh}, rng);
    std::vector<int64_t> pos(b * t);
    for (int64_t i = 0; i < b * t; ++i) pos[i] = 3 * (i % t) + 1;  // non-contiguous positions
    Tensor p = Tensor::from_indices(pos, {b, t});
    check("attention, gathered positions",
          max_abs_diff(values(attention(q, k, v, p)),
                       ref::attention(values(q), values(k), values(v), pos, pos, b, t, t, h, dh)),
          1e-4);
  }
  // The tiny shape of docs/performance.md, GPT-2 small's heads at seq 256, and the
  // GPT-2-small-like shape (rows of Q, K, V 2 KB apart: a stride that maps a tile's rows onto
  // few L1 sets).
  struct Shape { int64_t b, t, h, dh; };
  for (const Shape s : {Shape{8, 256, 4, 64}, Shape{4, 256, 12, 64}, Shape{4, 512, 8, 64}}) {
    const int64_t b = s.b, t = s.t, h = s.h, dh = s.dh;
    Tensor q = randn({b, t, h, dh}, rng), k = randn({b, t, h, dh}, rng),
           v = randn({b, t, h, dh}, rng), dout = randn({b, t, h, dh}, rng);
    std::vector<int64_t> pos(b * t);
    for (int64_t i = 0; i < b * t; ++i) pos[i] = i % t;
    Tensor p = Tensor::from_indices(pos, {b, t});
    Tensor out = Tensor::empty({b, t, h, dh}), lse = Tensor::empty({b, h, t});
    Tensor dq = Tensor::empty(q.shape()), dk = Tensor::empty(k.shape()),
           dv = Tensor::empty(v.shape());
    Backend& be = backend(Device::CPU);
    const auto forward = [&] { be.attention_forward(q, k, v, p, p, out, lse); };
    const auto backward = [&] { be.attention_backward(q, k, v, p, p, out, lse, dout, dq, dk, dv); };
    const double fwd = best_seconds(forward), bwd = best_seconds(backward);
    // In a training step the inputs were written by other ops since: caches hold other data.
    const double fwd_cold = best_seconds(forward, 0.3, evict_caches);
    const double bwd_cold = best_seconds(backward, 0.3, evict_caches);
    // Causal pairs only: forward 2 GEMMs (QK^T, PV), backward 5 (QK^T again, dV, dP, dQ, dK).
    const double pairs = b * h * t * (t + 1) / 2.0;
    const double f_fwd = 4.0 * dh * pairs, f_bwd = 10.0 * dh * pairs;
    const std::string name = "attention fwd B" + std::to_string(b) + " H" + std::to_string(h) +
                             " T" + std::to_string(t) + " Dh" + std::to_string(dh);
    report(name.c_str(), f_fwd / fwd / 1e9, "GF/s", c.gemm_gflops, 0);
    report("attention bwd", f_bwd / bwd / 1e9, "GF/s", c.gemm_gflops, 0);
    report("attention fwd+bwd", (f_fwd + f_bwd) / (fwd + bwd) / 1e9, "GF/s", c.gemm_gflops, 0.5);
    report("  caches cold: fwd", f_fwd / fwd_cold / 1e9, "GF/s", c.gemm_gflops, 0);
    report("  caches cold: bwd", f_bwd / bwd_cold / 1e9, "GF/s", c.gemm_gflops, 0);
  }
}

// A memory-bound kernel: bytes moved per call and the target fraction of bandwidth.
void bandwidth_line(const Ceilings& c, const char* name, double bytes,
                    const std::function<void()>& fn, double target = 0.6) {
  report(name, bytes / best_seconds(fn) / 1e9, "GB/s", c.bandwidth_gbs, target);
}

void bench_memory_bound(const Ceilings& c, Rng& rng) {
  Backend& be = backend(Device::CPU);
  std::printf("\nnorms, elementwise, routing (memory-bound; target >= 60%% of bandwidth)\n");
  {
    Tensor x = randn({29, 37}, rng), w = randn({37}, rng), bias = randn({37}, rng);
    check("rmsnorm", max_abs_diff(values(rmsnorm(x, w)), ref::rmsnorm(values(x), values(w), 29, 37, 1e-5)), 1e-4);
    check("layernorm", max_abs_diff(values(layernorm(x, w, bias)),
                                    ref::layernorm(values(x), values(w), values(bias), 29, 37, 1e-5)),
          1e-4);
    std::vector<double> g, s, sw;
    const auto xv = values(x);
    for (double e : xv) {
      g.push_back(ref::gelu(e));
      s.push_back(ref::silu(e));
    }
    Tensor up = randn({29, 37}, rng);
    const auto uv = values(up);
    for (size_t i = 0; i < xv.size(); ++i) sw.push_back(ref::silu(xv[i]) * uv[i]);
    check("gelu", max_abs_diff(values(gelu(x)), g), 1e-5);
    check("silu", max_abs_diff(values(silu(x)), s), 1e-5);
    check("swiglu", max_abs_diff(values(swiglu(x, up)), sw), 1e-5);
    check("softmax", max_abs_diff(values(softmax(x)), ref::softmax(xv, 29, 37)), 1e-6);
    // The fused residual add + norm equals add then the norm (bitwise on the CPU).
    check("add_rmsnorm", max_abs_diff(values(add_rmsnorm(x, up, w).normed),
                                      values(rmsnorm(add(x, up), w))), 0.0);
  }
  const int64_t n = 16384, d = 768;
  const double row_bytes = 4.0 * n * d;
  Tensor x = randn({n, d}, rng), w = randn({d}, rng), bias = randn({d}, rng), dy = randn({n, d}, rng);
  Tensor y = Tensor::empty({n, d}), dx = Tensor::empty({n, d}), dw = Tensor::empty({d}),
         db = Tensor::empty({d}), mean_t = Tensor::empty({n}), rstd = Tensor::empty({n});
  bandwidth_line(c, "rmsnorm fwd [16384,768]", 2 * row_bytes,
                 [&] { be.rmsnorm_forward(x, w, 1e-5, y, rstd); });
  bandwidth_line(c, "rmsnorm bwd", 3 * row_bytes,
                 [&] { be.rmsnorm_backward(dy, x, w, rstd, dx, dw); });
  bandwidth_line(c, "layernorm fwd", 2 * row_bytes,
                 [&] { be.layernorm_forward(x, w, bias, 1e-5, y, mean_t, rstd); });
  bandwidth_line(c, "layernorm bwd", 3 * row_bytes,
                 [&] { be.layernorm_backward(dy, x, w, mean_t, rstd, dx, dw, db); });
  bandwidth_line(c, "gelu fwd", 2 * row_bytes, [&] { be.gelu_forward(x, y); });
  bandwidth_line(c, "gelu bwd", 3 * row_bytes, [&] { be.gelu_backward(x, dy, dx); });
  bandwidth_line(c, "silu fwd", 2 * row_bytes, [&] { be.silu_forward(x, y); });
  bandwidth_line(c, "swiglu fwd", 3 * row_bytes, [&] { be.swiglu_forward(x, dy, y); });
  bandwidth_line(c, "swiglu bwd", 5 * row_bytes, [&] { be.swiglu_backward(x, dy, dy, dx, y); });
  bandwidth_line(c, "add [16384,768]", 3 * row_bytes,
                 [&] { be.binary(BinaryKind::Add, Broadcast::Same, 1, n * d, x, dy, y); });
  bandwidth_line(c, "mul by row [16384,768]*[16384,1]", 2 * row_bytes,
                 [&] { be.binary(BinaryKind::Mul, Broadcast::Outer, n, d, x, rstd, y); });
  bandwidth_line(c, "axpy (gradient accumulation)", 3 * row_bytes, [&] { be.axpy(0.5, x, y); });
  // The residual add fused with the norm: 4 row passes where add + norm take 5 forward, and
  // 4 where norm + axpy take 6 backward (docs/gpu.md "Fused ops").
  bandwidth_line(c, "add_rmsnorm fwd (x + a, norm)", 4 * row_bytes,
                 [&] { be.add_rmsnorm_forward(x, dy, w, 1e-5, dx, y, rstd); });
  bandwidth_line(c, "add_rmsnorm bwd (with ds)", 4 * row_bytes,
                 [&] { be.add_rmsnorm_backward(dy, x, dx, w, rstd, y, dw); });

  {  // MoD routing: B=64 sequences of 2048 tokens, C = 12.5% routed (50 MB moved: > L3)
    const int64_t b = 64, t = 2048, cap = 256;
    Tensor xs = randn({b, t, d}, rng), scores = randn({b, t}, rng);
    Tensor idx = topk_rows(scores, cap);
    {
      Tensor small = randn({3, 11, 5}, rng), sidx = topk_rows(randn({3, 11}, rng), 4);
      Tensor src = randn({3, 4, 5}, rng);
      check("gather_rows", max_abs_diff(values(gather_rows(small, sidx)),
                                        ref::gather_rows(values(small), indices(sidx), 3, 11, 4, 5)),
            0);
      check("scatter_add_rows",
            max_abs_diff(values(scatter_add_rows(small, sidx, src)),
                         ref::scatter_add_rows(values(small), indices(sidx), values(src), 3, 11, 4, 5)),
            1e-6);
      std::vector<double> row(scores.data<float>(), scores.data<float>() + t);
      const auto want = ref::topk_row(row, cap);
      const auto got = indices(idx);
      check("topk row 0", max_abs_diff(std::vector<double>(got.begin(), got.begin() + cap),
                                       std::vector<double>(want.begin(), want.end())),
            0);
    }
    Tensor gathered = Tensor::empty({b, cap, d});
    const double routed_bytes = 4.0 * b * cap * d;
    bandwidth_line(c, "gather_rows [64,2048,768] C=256", 2 * routed_bytes,
                   [&] { be.gather_rows(xs, idx, gathered); });
    bandwidth_line(c, "scatter_add_rows", 3 * routed_bytes,
                   [&] { be.scatter_add_rows(idx, gathered, xs); });
    Tensor sel = Tensor::empty({b, cap}, DType::I64);
    report("topk [64,2048] k=256 (info)",
           b * t / best_seconds([&] { be.topk_rows(scores, cap, sel); }) / 1e6, "Mtok/s", 1, 0);
  }
}

void bench_other(const Ceilings& c, Rng& rng) {
  Backend& be = backend(Device::CPU);
  std::printf("\nsoftmax, losses, rope, embedding, optimizer (memory-bound; reported)\n");
  {
    Tensor logits = randn({13, 37}, rng);
    std::vector<int64_t> tg(13);
    for (int64_t i = 0; i < 13; ++i) tg[i] = i % 3 == 0 ? -100 : (i * 7) % 37;
    check("cross_entropy", std::abs(cross_entropy(logits, Tensor::from_indices(tg, {13})).item() -
                                    ref::cross_entropy(values(logits), tg, 13, 37, -100)),
          1e-5);
    Tensor x = randn({2, 5, 3, 8}, rng);
    std::vector<int64_t> pos = {0, 2, 3, 7, 9, 1, 4, 6, 8, 15};
    check("rope", max_abs_diff(values(rope(x, Tensor::from_indices(pos, {2, 5}))),
                               ref::rope(values(x), pos, 2, 5, 3, 8, 10000.0)),
          1e-5);
    Tensor bl = randn({41}, rng), bt = rand_uniform({41}, rng);
    check("bce_with_logits",
          std::abs(bce_with_logits(bl, bt).item() - ref::bce_with_logits(values(bl), values(bt))),
          1e-5);
  }
  const int64_t n = 4096, v = 8192;
  const double bytes = 4.0 * n * v;
  Tensor logits = randn({n, v}, rng), probs = Tensor::empty({n, v}), dl = Tensor::empty({n, v});
  Tensor tgt = Tensor::zeros({n}, DType::I64), losses = Tensor::empty({n}), lse = Tensor::empty({n});
  const Tensor inv_n = Tensor::scalar(1.0 / n);
  bandwidth_line(c, "softmax fwd [4096,8192]", 2 * bytes, [&] { be.softmax_forward(logits, probs); }, 0);
  bandwidth_line(c, "softmax bwd", 3 * bytes, [&] { be.softmax_backward(probs, logits, dl); }, 0);
  bandwidth_line(c, "cross_entropy fwd [4096,8192]", bytes,
                 [&] { be.cross_entropy_forward(logits, tgt, -100, losses, lse); }, 0);
  bandwidth_line(c, "cross_entropy bwd", 2 * bytes,
                 [&] { be.cross_entropy_backward(logits, tgt, lse, -100, 0, inv_n, dl); }, 0);
  {
    const int64_t b = 8, t = 1024, h = 12, dh = 64;
    Tensor x = randn({b, t, h, dh}, rng), y = Tensor::empty({b, t, h, dh});
    std::vector<int64_t> pos(b * t);
    for (int64_t i = 0; i < b * t; ++i) pos[i] = i % t;
    Tensor p = Tensor::from_indices(pos, {b, t});
    bandwidth_line(c, "rope [8,1024,12,64]", 8.0 * b * t * h * dh,
                   [&] { be.rope(x, p, 10000.0, false, y); }, 0);
  }
  {
    const int64_t vocab = 50304, d = 768, tokens = 16384;
    Tensor table = randn({vocab, d}, rng), out = Tensor::empty({tokens, d});
    std::vector<int64_t> ids(tokens);
    for (auto& i : ids) i = rng.below(vocab);
    Tensor id = Tensor::from_indices(ids, {tokens});
    bandwidth_line(c, "embedding fwd 16384 x 768", 8.0 * tokens * d,
                   [&] { be.embedding_forward(id, table, out); }, 0);
    bandwidth_line(c, "embedding bwd (scatter-add)", 12.0 * tokens * d,
                   [&] { be.embedding_backward(id, out, table); }, 0);
  }
  {
    const int64_t n_params = int64_t{1} << 24;
    Tensor p = randn({n_params}, rng), g = randn({n_params}, rng), m = Tensor::zeros({n_params}),
           v2 = Tensor::zeros({n_params});
    AdamWArgs args;
    const auto k = adamw_step_constants(args);
    const Tensor consts = Tensor::from_vector({k.begin(), k.end()}, {kAdamWConstants}, DType::F64);
    bandwidth_line(c, "adamw 16M params", 28.0 * n_params,
                   [&] { be.adamw_update(p, g, m, v2, args, consts, Tensor()); }, 0);
    const Tensor clip = Tensor::full({}, 0.5);  // the clip factor, read inside the update
    bandwidth_line(c, "adamw 16M params, clipped", 28.0 * n_params,
                   [&] { be.adamw_update(p, g, m, v2, args, consts, clip); }, 0);
    Tensor t = rand_uniform({n_params}, rng), l = Tensor::empty({n_params});
    bandwidth_line(c, "bce_with_logits fwd 16M", 12.0 * n_params,
                   [&] { be.bce_with_logits_forward(p, t, l); }, 0);
  }
}

}  // namespace

// ops_bench [SECTION]: all sections, or one of matmul, attention, memory, other.
int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  auto wanted = [&](const char* section) { return only.empty() || only == section; };
  if (!only.empty() && !wanted("matmul") && !wanted("attention") && !wanted("memory") &&
      !wanted("other")) {
    std::fprintf(stderr, "ops_bench: unknown section '%s' (matmul, attention, memory, other)\n",
                 only.c_str());
    return 2;
  }
  std::printf("modtrain ops_bench\n%s\n", device_report().c_str());
  Rng rng(42);
  const Ceilings c = measure_ceilings();
  std::printf("\nceilings measured now: SGEMM %.1f GF/s ([4096,768]x[3072,768]^T), "
              "memory bandwidth %.1f GB/s (triad, 3 x 256 MB)\n"
              "bytes are counted as STREAM does (no write-allocate traffic), so in-place kernels "
              "(axpy, scatter-add, adamw) can pass 100%%\n",
              c.gemm_gflops, c.bandwidth_gbs);
  if (wanted("matmul")) bench_matmul(c, rng);
  if (wanted("attention")) bench_attention(c, rng);
  if (wanted("memory")) bench_memory_bound(c, rng);
  if (wanted("other")) bench_other(c, rng);
  std::printf("\n%d line(s) below target\n", g_misses);
  return 0;
}
