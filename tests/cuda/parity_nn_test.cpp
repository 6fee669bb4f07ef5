// CUDA against CPU, part 2: embedding, norms, activations, softmax, logsumexp, cross-entropy
// (and the fused classifier, its kernel and its op), the fused GELU MLP, BCE and AdamW, forward
// and backward.
// Backward cases take the forward's cached statistics from the CPU's f64 forward on the rounded
// inputs (backend_parity.h), so each kernel is tested alone.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/all_ops.h"
#include "core/ops/optim.h"
#include "core/recompute.h"
#include "tests/cuda/backend_parity.h"

using namespace mod;
using namespace mod::parity;

namespace {

// x with a few entries far out in both tails, where activations saturate.
Tensor with_tails(Tensor x) {
  const double tails[] = {-80.0, -30.0, -8.0, 8.0, 30.0, 80.0};
  for (int64_t i = 0; i < static_cast<int64_t>(std::size(tails)) && i * 7 < x.numel(); ++i)
    x.set(i * 7, tails[i]);
  return x;
}

}  // namespace

TEST_CASE("cuda: embedding forward and backward, repeated ids, i32 and i64 ids", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType id_type = GENERATE(DType::I32, DType::I64);
  Rng rng(201);
  struct Size {
    int64_t vocab, d, n;
  };
  // About two uses per id in the first, mostly unique ids in the second; the first four ids are
  // always the same, so some row collects four gradients.
  for (Size s : {Size{60, 67, 120}, Size{1000, 256, 64}}) {
    INFO("V " << s.vocab << ", D " << s.d << ", N " << s.n << ", ids " << dtype_name(id_type));
    std::vector<int64_t> ids(static_cast<size_t>(s.n));
    for (auto& id : ids) id = rng.below(s.vocab);
    for (size_t i = 1; i < 4; ++i) ids[i] = ids[0];
    const Tensor ids_t = indices(ids, {s.n}, id_type);
    check_parity(p,
                 {in("ids", ids_t), in("table", normal({s.vocab, s.d}, rng)),
                  out("out", {s.n, s.d})},
                 [](Backend& b, std::vector<Tensor>& t) { b.embedding_forward(t[0], t[1], t[2]); });
    check_parity(
        p,
        {in("ids", ids_t), in("dout", normal({s.n, s.d}, rng)),
         inout("dtable", normal({s.vocab, s.d}, rng))},
        [](Backend& b, std::vector<Tensor>& t) { b.embedding_backward(t[0], t[1], t[2]); });
  }
}

// The vocabulary-parallel bookkeeping: ids below, inside and above the slice, and ignored.
TEST_CASE("cuda: index_slice", "[cuda]") {
  const DType dtype = GENERATE(DType::F32, DType::F64, DType::BF16);
  const std::vector<int64_t> ids = {5, 300, 699, 700, 999, -100, 450, 0, 301};
  const int64_t n = static_cast<int64_t>(ids.size());
  for (DType index : {DType::I32, DType::I64}) {
    INFO(dtype_name(dtype) << " flags, " << dtype_name(index) << " ids");
    const Tensor host_ids = indices(ids, {n}, index);
    Tensor local = Tensor::empty({n}, DType::I64, Device::CUDA), here = Tensor::empty({n}, dtype, Device::CUDA);
    gpu().index_slice(host_ids.to(Device::CUDA), 300, 400, local, here);
    Tensor want_local = Tensor::empty({n}, DType::I64), want_here = Tensor::empty({n}, DType::F64);
    cpu().index_slice(host_ids, 300, 400, want_local, want_here);
    CHECK(local.to(Device::CPU).to_vector() == want_local.to_vector());
    CHECK(here.to(Device::CPU).to(DType::F64).to_vector() == want_here.to_vector());
  }
}

TEST_CASE("cuda: rmsnorm and layernorm, forward and backward", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(202);
  const double eps = 1e-5;
  struct Size {
    int64_t n, d;
  };
  // A row narrower than a block, one wider than several, many rows for dweight's reduction, and
  // D = 3 (at D <= 2 dx cancels to rounding noise, which no two devices share).
  for (Size s : {Size{37, 96}, Size{5, 1000}, Size{300, 64}, Size{3, 3}}) {
    INFO("N " << s.n << ", D " << s.d);
    const Tensor x = rounded(normal({s.n, s.d}, rng, 2.0, 0.5), p.dtype);
    const Tensor w = rounded(normal({s.d}, rng, 0.5, 1.0), p.dtype);
    const Tensor bias = rounded(normal({s.d}, rng), p.dtype);
    const Tensor dy = normal({s.n, s.d}, rng);

    check_parity(p, {in("x", x), in("weight", w), out("y", {s.n, s.d}), out("rstd", {s.n})},
                 [&](Backend& b, std::vector<Tensor>& t) {
                   b.rmsnorm_forward(t[0], t[1], eps, t[2], t[3]);
                 });
    Tensor y = Tensor::empty({s.n, s.d}, DType::F64), rstd = Tensor::empty({s.n}, DType::F64);
    cpu().rmsnorm_forward(x, w, eps, y, rstd);
    check_parity(p,
                 {in("dy", dy), in("x", x), in("weight", w), in("rstd", rstd),
                  out("dx", {s.n, s.d}), out("dweight", {s.d})},
                 [](Backend& b, std::vector<Tensor>& t) {
                   b.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
                 });

    check_parity(p,
                 {in("x", x), in("weight", w), in("bias", bias), out("y", {s.n, s.d}),
                  out("mean", {s.n}), out("rstd", {s.n})},
                 [&](Backend& b, std::vector<Tensor>& t) {
                   b.layernorm_forward(t[0], t[1], t[2], eps, t[3], t[4], t[5]);
                 });
    Tensor mean = Tensor::empty({s.n}, DType::F64);
    cpu().layernorm_forward(x, w, bias, eps, y, mean, rstd);
    check_parity(p,
                 {in("dy", dy), in("x", x), in("weight", w), in("mean", mean), in("rstd", rstd),
                  out("dx", {s.n, s.d}), out("dweight", {s.d}), out("dbias", {s.d})},
                 [](Backend& b, std::vector<Tensor>& t) {
                   b.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
                 });
  }
}

// The residual add fused with each norm: s = x + a (rounded to the dtype on the GPU) and its
// norm; the backward adds ds (or nothing, when only the norm reached the loss) to the norm's dx.
TEST_CASE("cuda: add_rmsnorm and add_layernorm, forward and backward", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(209);
  const double eps = 1e-5;
  struct Size {
    int64_t n, d;
  };
  // As for the plain norms: narrow and wide rows, many rows for dweight, and D = 3.
  for (Size s : {Size{37, 96}, Size{5, 1000}, Size{300, 64}, Size{3, 3}}) {
    INFO("N " << s.n << ", D " << s.d);
    const Tensor x = rounded(normal({s.n, s.d}, rng, 2.0, 0.5), p.dtype);
    const Tensor a = rounded(normal({s.n, s.d}, rng, 1.0), p.dtype);
    const Tensor w = rounded(normal({s.d}, rng, 0.5, 1.0), p.dtype);
    const Tensor bias = rounded(normal({s.d}, rng), p.dtype);
    const Tensor dy = normal({s.n, s.d}, rng);
    const Tensor ds = normal({s.n, s.d}, rng);
    check_parity(p,
                 {in("x", x), in("a", a), in("weight", w), out("s", {s.n, s.d}),
                  out("y", {s.n, s.d}), out("rstd", {s.n})},
                 [&](Backend& b, std::vector<Tensor>& t) {
                   b.add_rmsnorm_forward(t[0], t[1], t[2], eps, t[3], t[4], t[5]);
                 });
    check_parity(p,
                 {in("x", x), in("a", a), in("weight", w), in("bias", bias),
                  out("s", {s.n, s.d}), out("y", {s.n, s.d}), out("mean", {s.n}),
                  out("rstd", {s.n})},
                 [&](Backend& b, std::vector<Tensor>& t) {
                   b.add_layernorm_forward(t[0], t[1], t[2], t[3], eps, t[4], t[5], t[6], t[7]);
                 });

    // The backward's s as the GPU stores it, and the statistics of that s.
    Tensor sum = Tensor::empty({s.n, s.d}, DType::F64), y = Tensor::empty({s.n, s.d}, DType::F64);
    Tensor mean = Tensor::empty({s.n}, DType::F64), rstd = Tensor::empty({s.n}, DType::F64);
    cpu().binary(BinaryKind::Add, Broadcast::Same, 1, x.numel(), x, a, sum);
    sum = rounded(sum, p.dtype);
    for (bool with_ds : {true, false}) {
      INFO((with_ds ? "with ds" : "without ds"));
      cpu().rmsnorm_forward(sum, w, eps, y, rstd);
      check_parity(p,
                   {in("dy", dy), in("ds", ds), in("s", sum), in("weight", w), in("rstd", rstd),
                    out("dx", {s.n, s.d}), out("dweight", {s.d})},
                   [&](Backend& b, std::vector<Tensor>& t) {
                     b.add_rmsnorm_backward(t[0], with_ds ? t[1] : Tensor(), t[2], t[3], t[4],
                                            t[5], t[6]);
                   });
      cpu().layernorm_forward(sum, w, bias, eps, y, mean, rstd);
      check_parity(p,
                   {in("dy", dy), in("ds", ds), in("s", sum), in("weight", w), in("mean", mean),
                    in("rstd", rstd), out("dx", {s.n, s.d}), out("dweight", {s.d}),
                    out("dbias", {s.d})},
                   [&](Backend& b, std::vector<Tensor>& t) {
                     b.add_layernorm_backward(t[0], with_ds ? t[1] : Tensor(), t[2], t[3], t[4],
                                              t[5], t[6], t[7], t[8]);
                   });
    }
  }
}

TEST_CASE("cuda: gelu, silu, sigmoid and swiglu, forward and backward", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(203);
  for (const Shape& shape : {Shape{13, 257}, Shape{1}, Shape{4, 100000}}) {
    INFO("shape " << shape_str(shape));
    const Tensor x = with_tails(normal(shape, rng, 3.0));
    const Tensor dy = normal(shape, rng);
    using Forward = void (Backend::*)(const Tensor&, Tensor&);
    using Backward = void (Backend::*)(const Tensor&, const Tensor&, Tensor&);
    struct Activation {
      const char* name;
      Forward forward;
      Backward backward;
    };
    const Activation activations[] = {
        {"gelu", &Backend::gelu_forward, &Backend::gelu_backward},
        {"silu", &Backend::silu_forward, &Backend::silu_backward},
        {"sigmoid", &Backend::sigmoid_forward, &Backend::sigmoid_backward},
    };
    for (const Activation& a : activations) {
      INFO(a.name);
      check_parity(p, {in("x", x), out("y", shape)},
                   [&](Backend& b, std::vector<Tensor>& t) { (b.*a.forward)(t[0], t[1]); });
      check_parity(p, {in("x", x), in("dy", dy), out("dx", shape)},
                   [&](Backend& b, std::vector<Tensor>& t) { (b.*a.backward)(t[0], t[1], t[2]); });
    }
    const Tensor up = normal(shape, rng, 2.0);
    check_parity(p, {in("gate", x), in("up", up), out("y", shape)},
                 [](Backend& b, std::vector<Tensor>& t) { b.swiglu_forward(t[0], t[1], t[2]); });
    check_parity(p,
                 {in("gate", x), in("up", up), in("dy", dy), out("dgate", shape),
                  out("dup", shape)},
                 [](Backend& b, std::vector<Tensor>& t) {
                   b.swiglu_backward(t[0], t[1], t[2], t[3], t[4]);
                 });
  }
}

TEST_CASE("cuda: softmax forward and backward, up to a 50257-wide row", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(204);
  struct Size {
    int64_t n, v;
  };
  for (Size s : {Size{37, 33}, Size{4, 1000}, Size{3, 50257}, Size{5, 1}}) {
    INFO("N " << s.n << ", V " << s.v);
    const Tol tol = s.v > 10000 ? Tol::Long : Tol::Normal;
    const Tensor x = rounded(normal({s.n, s.v}, rng, 3.0), p.dtype);
    check_parity(
        p, {in("x", x), out("y", {s.n, s.v})},
        [](Backend& b, std::vector<Tensor>& t) { b.softmax_forward(t[0], t[1]); }, tol);
    Tensor y = Tensor::empty({s.n, s.v}, DType::F64);
    cpu().softmax_forward(x, y);
    check_parity(
        p, {in("y", y), in("dy", normal({s.n, s.v}, rng)), out("dx", {s.n, s.v})},
        [](Backend& b, std::vector<Tensor>& t) { b.softmax_backward(t[0], t[1], t[2]); }, tol);
  }
}

// Rows: ordinary; all -inf (gives -inf); half -inf (a mask); one +inf (gives +inf); large
// values (1e4 + noise: needs the max subtracted); one finite value among -inf.
TEST_CASE("cuda: logsumexp with -inf rows, +inf, large values and a 50257-wide row", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(205);
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t v = 100;
  Tensor x = normal({6, v}, rng, 2.0);
  for (int64_t i = 0; i < v; ++i) {
    x.set(1 * v + i, -inf);
    if (i % 2 == 0) x.set(2 * v + i, -inf);
    x.set(4 * v + i, 1e4 + x.at(4 * v + i));
    if (i != 37) x.set(5 * v + i, -inf);
  }
  x.set(3 * v + 50, inf);
  check_parity(p, {in("x", x), out("out", {6})},
               [](Backend& b, std::vector<Tensor>& t) { b.logsumexp_forward(t[0], t[1]); });
  INFO("2 rows of 50257");
  check_parity(
      p, {in("x", normal({2, 50257}, rng, 3.0)), out("out", {2})},
      [](Backend& b, std::vector<Tensor>& t) { b.logsumexp_forward(t[0], t[1]); }, Tol::Long);
}

TEST_CASE("cuda: cross-entropy forward and backward, ignore_index, a 50257-wide row", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType target_type = GENERATE(DType::I32, DType::I64);
  Rng rng(206);
  struct Size {
    int64_t n, v, ignore_index;
  };
  // ignore_index -100 (PyTorch's) and a valid class id, which then ignores rows targeting it.
  for (Size s : {Size{33, 1000, -100}, Size{4, 50257, -100}, Size{9, 17, 3}}) {
    INFO("N " << s.n << ", V " << s.v << ", ignore_index " << s.ignore_index << ", targets "
              << dtype_name(target_type));
    const Tol tol = s.v > 10000 ? Tol::Long : Tol::Normal;
    std::vector<int64_t> targets(static_cast<size_t>(s.n));
    for (auto& t : targets) t = rng.below(s.v);
    targets[1] = s.ignore_index;  // row 1 ignored in every case
    targets.back() = s.v - 1;     // the last class
    const Tensor targets_t = indices(targets, {s.n}, target_type);
    const Tensor logits = rounded(normal({s.n, s.v}, rng, 2.0), p.dtype);
    // lse is compared on ignored rows too: the CPU computes it there (same pass, same cost).
    check_parity(
        p,
        {in("logits", logits), in("targets", targets_t), out("losses", {s.n}),
         out("lse", {s.n})},
        [&](Backend& b, std::vector<Tensor>& t) {
          b.cross_entropy_forward(t[0], t[1], s.ignore_index, t[2], t[3]);
        },
        tol);
    Tensor losses = Tensor::empty({s.n}, DType::F64), lse = Tensor::empty({s.n}, DType::F64);
    cpu().cross_entropy_forward(logits, targets_t, s.ignore_index, losses, lse);
    const Tensor grad_scale = Tensor::scalar(1.0 / static_cast<double>(s.n - 1), DType::F64);
    // Under bf16 the lse comes in bf16 (what the forward caches beside bf16 logits) and in f32.
    // The GPU recomputes a bf16 one in f32 (its spacing near 10 is 1/16, 3% of every
    // probability), so the CPU reference is given the exact lse in both cases.
    const Tensor exact_lse = lse.to(DType::F32);
    for (bool lse_f32 : {false, true}) {
      if (lse_f32 && p.dtype != DType::BF16) continue;
      INFO((lse_f32 ? "lse f32" : "lse in the logits' dtype"));
      const Arg lse_arg = lse_f32 ? f32_when_bf16(in("lse", lse)) : in("lse", lse);
      check_parity(
          p,
          {in("logits", logits), in("targets", targets_t), lse_arg, in("scale", grad_scale),
           out("dlogits", {s.n, s.v})},
          [&](Backend& b, std::vector<Tensor>& t) {
            const bool exact = &b == &cpu() && p.dtype == DType::BF16;
            b.cross_entropy_backward(t[0], t[1], exact ? exact_lse : t[2], s.ignore_index, 0,
                                     t[3], t[4]);
          },
          tol);
    }
  }
}

// The fused classifier's kernel: losses, then dlogits written over the logits (InOut), or the
// losses alone with the logits left as they were (In, checked unchanged).
TEST_CASE("cuda: cross_entropy_with_dlogits, in place, ignore_index, a 50257-wide row",
          "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const DType target_type = GENERATE(DType::I32, DType::I64);
  Rng rng(209);
  struct Size {
    int64_t n, v, ignore_index;
  };
  for (Size s : {Size{33, 1000, -100}, Size{4, 50257, -100}, Size{9, 17, 3}}) {
    INFO("N " << s.n << ", V " << s.v << ", ignore_index " << s.ignore_index << ", targets "
              << dtype_name(target_type));
    const Tol tol = s.v > 10000 ? Tol::Long : Tol::Normal;
    std::vector<int64_t> targets(static_cast<size_t>(s.n));
    for (auto& t : targets) t = rng.below(s.v);
    targets[1] = s.ignore_index;
    targets.back() = s.v - 1;
    const Tensor targets_t = indices(targets, {s.n}, target_type);
    const Tensor logits = rounded(normal({s.n, s.v}, rng, 2.0), p.dtype);
    const Tensor scale = Tensor::scalar(1.0 / static_cast<double>(s.n - 1), DType::F64);
    check_parity(
        p,
        {inout("logits", logits), in("targets", targets_t), f32_when_bf16(in("scale", scale)),
         f32_when_bf16(out("losses", {s.n}))},
        [&](Backend& b, std::vector<Tensor>& t) {
          b.cross_entropy_with_dlogits(t[0], t[1], s.ignore_index, t[2], t[3]);
        },
        tol);
    INFO("the loss alone");
    check_parity(
        p, {in("logits", logits), in("targets", targets_t), f32_when_bf16(out("losses", {s.n}))},
        [&](Backend& b, std::vector<Tensor>& t) {
          b.cross_entropy_with_dlogits(t[0], t[1], s.ignore_index, Tensor(), t[2]);
        },
        tol);
  }
}

// The whole op on the GPU against the CPU: chunk GEMMs, the kernel, dx and dW summed over
// chunks (in f32 for bf16), the backward's scaling. f32, and bf16 against the CPU's f32 on the
// same bf16 values.
TEST_CASE("cuda: linear_cross_entropy loss and gradients against the CPU (f32, bf16)", "[cuda]") {
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  const Precision p = precision(dtype);
  Rng rng(210);
  const int64_t n = 74, d = 64, v = 1000;
  const Tensor x = rounded(normal({n, d}, rng), dtype);
  const Tensor w = rounded(normal({v, d}, rng, 0.2), dtype);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (auto& id : ids) id = rng.below(v);
  ids[3] = ids[40] = -100;
  const Tensor targets = indices(ids, {n});
  for (int64_t chunk_rows : {int64_t{16}, int64_t{0}}) {
    INFO(dtype_name(dtype) << ", chunk_rows " << chunk_rows);
    // The CPU in f32 (f64 inputs converted), the GPU in the dtype under test.
    Tensor xc = x.to(DType::F32).set_requires_grad(true);
    Tensor wc = w.to(DType::F32).set_requires_grad(true);
    const Tensor loss_c = linear_cross_entropy(xc, wc, targets, -100, chunk_rows);
    scale(loss_c, 0.5).backward();
    Tensor xg = to_gpu(x, dtype).set_requires_grad(true);
    Tensor wg = to_gpu(w, dtype).set_requires_grad(true);
    const Tensor loss_g =
        linear_cross_entropy(xg, wg, targets.to(Device::CUDA), -100, chunk_rows);
    CHECK(loss_g.dtype() == DType::F32);
    scale(loss_g, 0.5).backward();
    auto host = [](const Tensor& t) { return t.to(DType::F32).to(Device::CPU); };
    expect_close("loss", host(loss_g), loss_c, p.rtol);
    expect_close("dx", host(xg.grad()), xc.grad(), p.rtol);
    expect_close("dW", host(wg.grad()), wc.grad(), p.rtol);
  }
}

// The fused GELU MLP on the GPU (cuBLASLt epilogues at F 128, the fallback at F 36) against the
// CPU's fused op (equal to linear, gelu, linear there), twice to add into the weights' gradients.
TEST_CASE("cuda: gelu_mlp output and gradients against the CPU (f32, bf16)", "[cuda]") {
  const DType dtype = GENERATE(DType::F32, DType::BF16);
  const Precision p = precision(dtype);
  Rng rng(211);
  for (int64_t f : {int64_t{128}, int64_t{36}}) {
    INFO(dtype_name(dtype) << ", F " << f);
    const int64_t n = 70, d = 64;
    const Tensor x = rounded(normal({2, n / 2, d}, rng), dtype);
    const Tensor up = rounded(normal({f, d}, rng, 0.2), dtype);
    const Tensor down = rounded(normal({d, f}, rng, 0.1), dtype);
    const Tensor r = rounded(normal({2, n / 2, d}, rng), dtype);
    Tensor xc = x.to(DType::F32).set_requires_grad(true);
    Tensor uc = up.to(DType::F32).set_requires_grad(true);
    Tensor dc = down.to(DType::F32).set_requires_grad(true);
    Tensor xg = to_gpu(x, dtype).set_requires_grad(true);
    Tensor ug = to_gpu(up, dtype).set_requires_grad(true);
    Tensor dg = to_gpu(down, dtype).set_requires_grad(true);
    const Tensor rg = to_gpu(r, dtype), rc = r.to(DType::F32);
    Tensor yc, yg;
    for (int pass = 0; pass < 2; ++pass) {
      yc = gelu_mlp(xc, uc, dc);
      sum(mul(yc, rc)).backward();
      yg = gelu_mlp(xg, ug, dg);
      sum(mul(yg, rg)).backward();
    }
    auto host = [](const Tensor& t) { return t.to(DType::F32).to(Device::CPU); };
    // cuBLASLt's GELU epilogues are not f32-exact (see the gemm_gelu test): Tol::Long.
    const double rtol = p.tolerance(Tol::Long);
    expect_close("y", host(yg), yc, rtol);
    expect_close("dx", host(xg.grad()), xc.grad(), rtol);
    expect_close("dW_up", host(ug.grad()), uc.grad(), rtol);
    expect_close("dW_down", host(dg.grad()), dc.grad(), rtol);
  }
}

// SELECTIVE recomputation keeps gelu_mlp's GEMM outputs and recomputes h with the GELU kernel,
// so its forward computes h that way too (the epilogue's GELU of the f32 accumulator differs by
// an ulp in bf16): the gradients are then those of the forward that ran. Its output and dW_down
// are bitwise those of the unfused linear, GELU, linear, which issue the same GEMMs and kernel;
// a forward through the epilogue (what NONE runs) would not be. NONE stays within Tol::Long.
TEST_CASE("cuda: gelu_mlp under SELECTIVE recomputation differentiates the forward it ran",
          "[cuda]") {
  const DType dtype = DType::BF16;
  Rng rng(212);
  const int64_t n = 64, d = 64, f = 256;
  const Tensor x = to_gpu(normal({n, d}, rng), dtype);
  const Tensor up = to_gpu(normal({f, d}, rng, 0.2), dtype);
  const Tensor down = to_gpu(normal({d, f}, rng, 0.1), dtype);
  const Tensor r = to_gpu(normal({n, d}, rng), dtype);
  struct Run {
    Tensor y, dx, dup, ddown;
  };
  auto run = [&](auto&& forward) {
    Tensor xg = x.clone().set_requires_grad(true);
    Tensor ug = up.clone().set_requires_grad(true);
    Tensor dg = down.clone().set_requires_grad(true);
    Tensor y = forward(xg, ug, dg);
    sum(mul(y, r)).backward();
    auto host = [](const Tensor& t) { return t.to(DType::F32).to(Device::CPU); };
    return Run{host(y), host(xg.grad()), host(ug.grad()), host(dg.grad())};
  };
  const Run selective = run([](const Tensor& xg, const Tensor& ug, const Tensor& dg) {
    return recompute_region(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu_mlp(in[0], ug, dg)}; },
        {xg}, RegionKeeps::CostlyOpOutputs)[0];
  });
  const Run unfused = run([](const Tensor& xg, const Tensor& ug, const Tensor& dg) {
    return matmul(gelu(matmul(xg, ug, false, true)), dg, false, true);
  });
  const Run none = run([](const Tensor& xg, const Tensor& ug, const Tensor& dg) {
    return gelu_mlp(xg, ug, dg);
  });
  CHECK(selective.y.to_vector() == unfused.y.to_vector());
  CHECK(selective.ddown.to_vector() == unfused.ddown.to_vector());
  const double rtol = precision(dtype).tolerance(Tol::Long);
  expect_close("y", selective.y, none.y, rtol);
  expect_close("dx", selective.dx, none.dx, rtol);
  expect_close("dW_up", selective.dup, none.dup, rtol);
  expect_close("dW_down", selective.ddown, none.ddown, rtol);
}

TEST_CASE("cuda: cross-entropy backward on a vocabulary slice (vocabulary-parallel loss)",
          "[cuda]") {
  const Precision p = precision(GENERATE(DType::F64, DType::F32));
  Rng rng(208);
  // Columns [300, 700) of a 1000-wide vocabulary: targets below, inside and above the slice,
  // one ignored; lse is the whole row's, as the tp ranks' all-reduce makes it.
  const int64_t n = 8, v = 400, start = 300, ignore = -100;
  const std::vector<int64_t> targets = {5, 300, 699, 700, 999, ignore, 450, 0};
  const Tensor logits = rounded(normal({n, v}, rng, 2.0), p.dtype);
  const Tensor lse = normal({n}, rng, 1.0, 8.0);
  check_parity(
      p,
      {in("logits", logits), in("targets", indices(targets, {n}, DType::I64)), in("lse", lse),
       in("scale", Tensor::scalar(0.125, DType::F64)), out("dlogits", {n, v})},
      [&](Backend& b, std::vector<Tensor>& t) {
        b.cross_entropy_backward(t[0], t[1], t[2], ignore, start, t[3], t[4]);
      });
}

TEST_CASE("cuda: BCE with logits, forward and backward", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(207);
  const Shape shape{3, 333};
  const Tensor logits = with_tails(normal(shape, rng, 4.0));
  Tensor targets = uniform(shape, rng);  // soft targets, and hard ones in every other element
  for (int64_t i = 0; i < targets.numel(); i += 2) targets.set(i, targets.at(i) < 0.5 ? 0.0 : 1.0);
  check_parity(p, {in("logits", logits), in("targets", targets), out("losses", shape)},
               [](Backend& b, std::vector<Tensor>& t) {
                 b.bce_with_logits_forward(t[0], t[1], t[2]);
               });
  check_parity(p, {in("logits", logits), in("targets", targets), out("dlogits", shape)},
               [](Backend& b, std::vector<Tensor>& t) {
                 b.bce_with_logits_backward(t[0], t[1], 0.37, t[2]);
               });
}

// Five steps with a new gradient each: from fresh moments at step 1 (bias correction largest),
// and from random moments at step 100. Some gradients are exactly zero; the odd steps scale
// theirs by a clip factor read from the device.
TEST_CASE("cuda: adamw_update over several steps", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(208);
  const Shape shape{7, 131};
  constexpr int kSteps = 5;
  for (int64_t first_step : {int64_t{1}, int64_t{100}}) {
    INFO("steps " << first_step << " to " << first_step + kSteps - 1);
    AdamWArgs args;
    args.lr = 1e-2;
    args.beta1 = 0.9;
    args.beta2 = 0.95;
    args.eps = 1e-8;
    args.weight_decay = 0.1;
    const bool fresh = first_step == 1;
    std::vector<Arg> list = {
        inout("param", normal(shape, rng)),
        inout("m", fresh ? Tensor::zeros(shape, DType::F64) : normal(shape, rng, 0.1)),
        inout("v", fresh ? Tensor::zeros(shape, DType::F64) : uniform(shape, rng, 0.0, 0.01))};
    for (int s = 0; s < kSteps; ++s) {
      Tensor g = normal(shape, rng);
      g.set(s, 0.0);
      list.push_back(in("grad" + std::to_string(s), g));
    }
    list.push_back(in("grad_scale", Tensor::from_vector({0.37}, {1}, DType::F64)));
    check_parity(p, list, [&](Backend& b, std::vector<Tensor>& t) {
      for (int s = 0; s < kSteps; ++s) {
        AdamWArgs a = args;
        a.step = first_step + s;
        const auto c = adamw_step_constants(a);
        const Tensor consts =
            Tensor::from_vector({c.begin(), c.end()}, {kAdamWConstants}, DType::F64).to(b.device());
        b.adamw_update(t[0], t[3 + static_cast<size_t>(s)], t[1], t[2], a, consts,
                       s % 2 ? t[3 + kSteps] : Tensor());
      }
    });
  }
}

// The multi-tensor update against the CPU's (two parameters, one spanning several chunks of
// kMultiTensorChunk, both decay groups, a clip factor on odd steps).
TEST_CASE("cuda: adamw_update_multi over several steps", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(209);
  const std::vector<Shape> shapes = {{kMultiTensorChunk + 1001}, {7, 131}};
  constexpr int kSteps = 3;
  AdamWArgs hyper;
  hyper.weight_decay = 0.1;
  std::vector<Arg> list;
  for (const Shape& s : shapes) {
    list.push_back(inout("param", normal(s, rng)));
    list.push_back(inout("m", Tensor::zeros(s, DType::F64)));
    list.push_back(inout("v", Tensor::zeros(s, DType::F64)));
  }
  for (int step = 0; step < kSteps; ++step)
    for (const Shape& s : shapes) list.push_back(in("grad", normal(s, rng)));
  list.push_back(in("grad_scale", Tensor::from_vector({0.37}, {1}, DType::F64)));
  check_parity(p, list, [&](Backend& b, std::vector<Tensor>& t) {
    AdamWStepConstants consts(hyper, b.device());
    MultiTensorTable table;
    for (int step = 0; step < kSteps; ++step) {
      consts.set(1e-2, step + 1);
      std::vector<AdamWSlot> slots;
      for (size_t i = 0; i < shapes.size(); ++i)
        slots.push_back({t[3 * i], t[6 + static_cast<size_t>(step) * shapes.size() + i],
                         t[3 * i + 1], t[3 * i + 2], consts.tensor(i == 0), Tensor()});
      adamw_update_multi(slots, consts.args(true), step % 2 ? t.back() : Tensor(), table);
    }
  });
}

// On the GPU itself: the multi-tensor update equals the per-tensor kernel bitwise (one element
// function), and the bf16 copies it writes of f32 masters equal convert's.
TEST_CASE("cuda: adamw_update_multi equals adamw_update bitwise and writes bf16 copies", "[cuda]") {
  const DType dtype = GENERATE(MOD_PARITY_DTYPES);
  INFO(dtype_name(dtype));
  Rng rng(210);
  const std::vector<Shape> shapes = {{3}, {kMultiTensorChunk * 2 + 5}, {0}, {33, 65}};
  AdamWArgs hyper;
  hyper.weight_decay = 0.1;
  AdamWStepConstants consts(hyper, Device::CUDA);
  std::vector<Tensor> p, m, v, q, mq, vq, copies;
  for (const Shape& s : shapes) {
    p.push_back(to_gpu(normal(s, rng), dtype));
    q.push_back(p.back().clone());
    for (auto* t : {&m, &v, &mq, &vq}) t->push_back(Tensor::zeros(s, dtype, Device::CUDA));
    copies.push_back(Tensor::zeros(s, DType::BF16, Device::CUDA));
  }
  const Tensor scale = to_gpu(Tensor::from_vector({0.5}, {1}, DType::F64), dtype);
  MultiTensorTable table;
  for (int step = 1; step <= 3; ++step) {
    consts.set(1e-2, step);
    std::vector<AdamWSlot> slots;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Tensor g = to_gpu(normal(shapes[i], rng), dtype);
      const bool decays = i % 2 == 1;
      const Tensor copy = dtype == DType::F32 ? copies[i] : Tensor();
      slots.push_back({p[i], g, m[i], v[i], consts.tensor(decays), copy});
      adamw_update(q[i], g, mq[i], vq[i], consts.args(decays), consts.tensor(decays), scale);
    }
    adamw_update_multi(slots, consts.args(true), scale, table);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    INFO("tensor " << i);
    expect_equal("param", p[i].to(Device::CPU), q[i].to(Device::CPU));
    expect_equal("m", m[i].to(Device::CPU), mq[i].to(Device::CPU));
    expect_equal("v", v[i].to(Device::CPU), vq[i].to(Device::CPU));
    if (dtype == DType::F32)
      expect_equal("copy", copies[i].to(Device::CPU), p[i].to(DType::BF16).to(Device::CPU));
  }
}

// The norm's one pass against the CPU's: 200 small tensors and sizes either side of
// kMultiTensorChunk (so chunks of one tensor and of the next meet in the table), zero-sized
// tensors and narrow0 views at non-zero offsets. The GPU sums the dtype's values (bf16 too) in
// double, as the CPU sums the same values in f32 or f64: within 1e-12 relative. No atomics: a
// second call, with the kept table or a fresh one, gives the same bits.
TEST_CASE("cuda: sum_squares_multi against the CPU over many tensors, chunk edges and views",
          "[cuda]") {
  const DType dtype = GENERATE(MOD_PARITY_DTYPES);
  INFO(dtype_name(dtype));
  const DType cpu_dtype = dtype == DType::F64 ? DType::F64 : DType::F32;
  Rng rng(212);
  const int64_t c = kMultiTensorChunk;
  std::vector<Shape> shapes = {{c - 1}, {c}, {3, 0}, {c + 1}, {2 * c + 5}, {0}, {1}, {7, 131}};
  for (int i = 0; i < 200; ++i) shapes.push_back({1 + rng.below(3000)});
  std::vector<Tensor> cpu_xs, gpu_xs;
  for (const Shape& s : shapes) {
    const Tensor values = rounded(normal(s, rng), dtype);
    cpu_xs.push_back(values.to(cpu_dtype));
    gpu_xs.push_back(to_gpu(values, dtype));
  }
  const Tensor buffer = rounded(normal({3 * c, 2}, rng), dtype);
  const Tensor cpu_buffer = buffer.to(cpu_dtype), gpu_buffer = to_gpu(buffer, dtype);
  for (const auto& [start, rows] : std::vector<std::pair<int64_t, int64_t>>{
           {1, c / 2 - 3}, {c / 2 + 7, c + 100}, {5, 0}, {2 * c, c}}) {
    cpu_xs.push_back(cpu_buffer.narrow0(start, rows));
    gpu_xs.push_back(gpu_buffer.narrow0(start, rows));
  }
  MultiTensorTable cpu_table, gpu_table, fresh;
  const double want = sum_squares_multi(cpu_xs, Device::CPU, cpu_table).item();
  const Tensor got = sum_squares_multi(gpu_xs, Device::CUDA, gpu_table);
  CHECK(got.device() == Device::CUDA);
  CHECK(got.dtype() == DType::F64);
  INFO("gpu " << got.item() << ", cpu " << want);
  CHECK(std::abs(got.item() - want) <= 1e-12 * want);
  CHECK(sum_squares_multi(gpu_xs, Device::CUDA, gpu_table).item() == got.item());
  CHECK(sum_squares_multi(gpu_xs, Device::CUDA, fresh).item() == got.item());
  // One tensor alone, and nothing to sum: 0 for an empty list and for only empty tensors.
  CHECK(std::abs(sum_squares_multi({gpu_xs[4]}, Device::CUDA, fresh).item() -
                 sum_squares_multi({cpu_xs[4]}, Device::CPU, cpu_table).item()) <=
        1e-12 * sum_squares_multi({cpu_xs[4]}, Device::CPU, cpu_table).item());
  CHECK(sum_squares_multi({}, Device::CUDA, fresh).item() == 0.0);
  CHECK(sum_squares_multi({gpu_xs[2], gpu_xs[5]}, Device::CUDA, fresh).item() == 0.0);
}

// Captured, the pass reads the tensors' values at each replay through the table the eager call
// wrote (no rewrite inside the graph), as a captured training step's norm does.
TEST_CASE("cuda: sum_squares_multi in a CUDA graph sums the values present at replay", "[cuda]") {
  Rng rng(213);
  std::vector<Tensor> xs;
  for (const Shape& s : std::vector<Shape>{{kMultiTensorChunk + 3}, {17, 5}})
    xs.push_back(to_gpu(normal(s, rng), DType::F32));
  MultiTensorTable table;
  sum_squares_multi(xs, Device::CUDA, table);  // writes the table; fills the allocator's cache
  gpu().begin_capture();
  const Tensor out = sum_squares_multi(xs, Device::CUDA, table);
  const std::unique_ptr<CapturedWork> graph = gpu().end_capture();
  for (int replay = 0; replay < 2; ++replay) {
    for (Tensor& x : xs) x.copy_from(normal(x.shape(), rng).to(DType::F32));
    MultiTensorTable host_table;
    std::vector<Tensor> host;
    for (const Tensor& x : xs) host.push_back(x.to(Device::CPU));
    const double want = sum_squares_multi(host, Device::CPU, host_table).item();
    graph->replay();
    INFO("replay " << replay);
    CHECK(std::abs(out.item() - want) <= 1e-12 * want);
  }
}

// The device-side pieces of a captured step: the clip factor (below, at and above max_norm,
// and max_norm 0 = off) and the mean's divisor (some targets ignored, all ignored).
TEST_CASE("cuda: clip_factor and inverse_target_count", "[cuda]") {
  const DType dtype = GENERATE(MOD_PARITY_DTYPES);
  INFO("factor dtype " << dtype_name(dtype));
  // The CPU has no bf16 kernels: it computes in f32, rounded to bf16 as the GPU's f32 is.
  const DType cpu_dtype = dtype == DType::BF16 ? DType::F32 : dtype;
  auto as_gpu = [&](const Tensor& host) { return dtype == DType::BF16 ? host.to(DType::BF16) : host; };
  for (double sq : {0.0, 0.25, 1.0, 4.0, 1e6}) {
    for (double max_norm : {0.0, 1.0}) {
      INFO("sq " << sq << ", max_norm " << max_norm);
      Tensor results[2][2];  // [cpu, gpu][norm, factor]
      for (int d = 0; d < 2; ++d) {
        Backend& b = d ? gpu() : cpu();
        const Tensor sq_t = Tensor::scalar(sq, DType::F64).to(b.device());
        Tensor norm = Tensor::empty({}, DType::F64, b.device());
        Tensor factor = Tensor::empty({}, d ? dtype : cpu_dtype, b.device());
        b.clip_factor(sq_t, max_norm, norm, factor);
        results[d][0] = norm.to(Device::CPU);
        results[d][1] = d ? factor.to(Device::CPU) : as_gpu(factor);
      }
      CHECK(results[1][0].item() == results[0][0].item());
      CHECK(results[1][1].item() == results[0][1].item());
    }
  }
  const int64_t ignore = -100;
  for (int64_t ignored : {int64_t{0}, int64_t{3}, int64_t{5000}}) {
    std::vector<int64_t> ids(5000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) < ignored ? ignore : static_cast<int64_t>(i % 50);
    for (DType index : {DType::I32, DType::I64}) {
      const Tensor targets = indices(ids, {5000}, index);
      Tensor got = Tensor::empty({}, dtype, Device::CUDA), want = Tensor::empty({}, cpu_dtype);
      gpu().inverse_target_count(targets.to(Device::CUDA), ignore, got);
      cpu().inverse_target_count(targets, ignore, want);
      INFO(ignored << " of 5000 ignored, " << dtype_name(index));
      CHECK(got.to(Device::CPU).item() == as_gpu(want).item());
    }
  }
}
