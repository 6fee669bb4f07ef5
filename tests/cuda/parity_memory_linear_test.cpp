// CUDA against CPU, part 1: memory (allocate, copy, convert, fill, the caching allocator), GEMM
// (with and without GELU epilogues),
// the elementwise family and the reductions, plus zero-sized calls. Tolerances and the
// harness: backend_parity.h.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/cuda/allocator.h"
#include "core/cuda/device.h"
#include "tests/cuda/backend_parity.h"

using namespace mod;
using namespace mod::parity;

namespace {

// Bytes of a CPU tensor, for exact round-trip checks of any dtype.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Random values in every dtype: floats normal with a spread of magnitudes, indices signed.
Tensor host_values(const Shape& shape, DType dtype, Rng& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (is_index(dtype))
      t.set(i, static_cast<double>(rng.below(2000001) - 1000000));
    else
      t.set(i, rng.normal() * std::pow(10.0, static_cast<double>(rng.below(13) - 6)));
  }
  return t;
}

}  // namespace

TEST_CASE("cuda: describe, allocate and deallocate", "[cuda]") {
  CHECK_FALSE(gpu().describe().empty());
  CHECK(gpu().device() == Device::CUDA);
  for (size_t bytes : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
    INFO(bytes << " bytes");
    void* p = gpu().allocate(bytes);
    REQUIRE(p != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);  // Storage's promise for every backend
    gpu().deallocate(p, bytes);
  }
}

TEST_CASE("cuda: the caching allocator reuses a dropped block", "[cuda]") {
  const Shape shape{3 * (1 << 18) + 1};  // a little over 3 MiB of f32, a size nothing else uses
  const size_t before = cuda::allocator_stats().device_mallocs;
  const size_t in_use = cuda::allocator_stats().in_use_bytes;
  for (int i = 0; i < 100; ++i) {
    Tensor t = Tensor::empty(shape, DType::F32, Device::CUDA);
    REQUIRE(t.raw_data() != nullptr);
  }
  const cuda::AllocatorStats after = cuda::allocator_stats();
  INFO("cudaMalloc calls for 100 allocations of one size: " << after.device_mallocs - before);
  CHECK(after.device_mallocs - before <= 1);
  CHECK(after.in_use_bytes == in_use);
}

TEST_CASE("cuda: copies host to device, device to device and back are exact", "[cuda]") {
  Rng rng(101);
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16}) {
    INFO("dtype " << dtype_name(dtype));
    const Tensor host = host_values({37, 129}, dtype, rng);
    const Tensor dev = host.to(Device::CUDA);
    CHECK(dev.device() == Device::CUDA);
    Tensor dev2 = Tensor::empty(host.shape(), dtype, Device::CUDA);
    gpu().copy(dev, dev2);
    CHECK(same_bytes(dev2.to(Device::CPU), host));

    // Into rows [5, 12) of a device buffer: the rows around them are left alone.
    const Tensor whole = host_values({20, 129}, dtype, rng);
    Tensor dst = whole.to(Device::CUDA);
    Tensor rows = dst.narrow0(5, 7);
    rows.copy_from(host.narrow0(0, 7));
    const Tensor back = dst.to(Device::CPU);
    CHECK(same_bytes(back.narrow0(0, 5), whole.narrow0(0, 5)));
    CHECK(same_bytes(back.narrow0(5, 7), host.narrow0(0, 7)));
    CHECK(same_bytes(back.narrow0(12, 8), whole.narrow0(12, 8)));

    // Zero elements: nothing to do, nothing to fail.
    const Tensor empty = Tensor::empty({0, 3}, dtype).to(Device::CUDA);
    Tensor empty2 = Tensor::empty({0, 3}, dtype, Device::CUDA);
    gpu().copy(empty, empty2);
    CHECK(empty2.to(Device::CPU).numel() == 0);
  }
}

// The tensor- and expert-parallel permutations: a column block of one buffer into strided rows
// of another, every byte landing where the CPU puts it and the bytes between left alone.
TEST_CASE("cuda: copy_rows matches the CPU's 2-D strided copy", "[cuda]") {
  Rng rng(103);
  for (DType dtype : {DType::F32, DType::BF16}) {
    INFO("dtype " << dtype_name(dtype));
    const size_t es = dtype_size(dtype);
    const Tensor src = host_values({9, 40}, dtype, rng);
    Tensor want = host_values({12, 24}, dtype, rng);
    Tensor dev = want.to(Device::CUDA);
    // rows 1..7 of src, columns 3..13, into rows 2..8 of dst at column 5 (pitch 24).
    cpu().copy_rows(src, (40 + 3) * es, 40 * es, want, (2 * 24 + 5) * es, 24 * es, 7, 11 * es);
    gpu().copy_rows(src.to(Device::CUDA), (40 + 3) * es, 40 * es, dev, (2 * 24 + 5) * es,
                    24 * es, 7, 11 * es);
    CHECK(same_bytes(dev.to(Device::CPU), want));
  }
}

// Conversions are single IEEE roundings to nearest even (f64 -> bf16 rounds through f32 on
// both sides), so they must match the host bit for bit, infinities and signed zeros included.
TEST_CASE("cuda: convert between f64, f32 and bf16 rounds as the host does", "[cuda]") {
  Rng rng(102);
  const DType floats[] = {DType::F64, DType::F32, DType::BF16};
  for (DType from : floats)
    for (DType to : floats) {
      INFO("convert " << dtype_name(from) << " -> " << dtype_name(to));
      Tensor src = host_values({1000}, from, rng);
      const double specials[] = {std::numeric_limits<double>::infinity(),
                                 -std::numeric_limits<double>::infinity(), 0.0, -0.0, 1.0, -2.5,
                                 3.0e38, 1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0};  // ties to even
      for (size_t i = 0; i < std::size(specials); ++i)
        src.set(static_cast<int64_t>(i), specials[i]);
      Tensor want = Tensor::empty(src.shape(), to);
      for (int64_t i = 0; i < src.numel(); ++i) want.set(i, src.at(i));
      Tensor got = Tensor::empty(src.shape(), to, Device::CUDA);
      gpu().convert(src.to(Device::CUDA), got);
      const Tensor back = got.to(Device::CPU);
      expect_equal("converted", back, want);
      for (int64_t i = 0; i < 4; ++i)  // the sign of zero survives too
        CHECK(std::signbit(back.at(i)) == std::signbit(want.at(i)));
    }
}

TEST_CASE("cuda: fill every dtype", "[cuda]") {
  for (DType dtype : {DType::F32, DType::F64, DType::I32, DType::I64, DType::BF16})
    for (double value : {0.0, -3.0, 2.5, 0.1}) {
      if (is_index(dtype) && value != std::floor(value)) continue;
      INFO("fill " << dtype_name(dtype) << " with " << value);
      const Tensor want = Tensor::full({7, 301}, value, dtype);
      expect_equal("filled", Tensor::full({7, 301}, value, dtype, Device::CUDA).to(Device::CPU),
                   want);
    }
  Tensor none = Tensor::empty({0}, DType::F32, Device::CUDA);
  gpu().fill(none, 1.0);
  CHECK(none.numel() == 0);
}

TEST_CASE("cuda: gemm, every transpose, batch strides (0 included), alpha, accumulate",
          "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(103);
  struct Case {
    const char* what;
    int64_t batch, m, n, k;
    int64_t pad_a, pad_b, pad_c;  // extra elements between batch entries; -1: stride 0
    double alpha;
    bool accumulate;
  };
  const Case cases[] = {
      {"one matrix, odd sizes", 1, 33, 17, 65, 0, 0, 0, 1.0, false},
      {"packed batch, alpha, accumulate", 3, 20, 31, 40, 0, 0, 0, 0.5, true},
      {"B shared over the batch (stride 0)", 4, 19, 24, 37, 0, -1, 0, -1.25, false},
      {"A shared (stride 0), padded B and C, accumulate", 3, 21, 18, 29, -1, 7, 5, 2.0, true},
      {"a row times a matrix", 2, 1, 257, 300, 3, 0, 0, 1.0, false},
      {"a matrix times a column", 2, 128, 1, 96, 0, 0, 0, 1.0, true},
      {"long k", 1, 64, 48, 4096, 0, 0, 0, 1.0, false},
      {"k = 0: C = 0 (an expert that got no tokens)", 2, 5, 6, 0, 0, 0, 0, 1.0, false},
      {"k = 0 with accumulate: C unchanged", 2, 5, 6, 0, 0, 0, 0, 1.0, true},
  };
  for (const Case& c : cases)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        INFO(c.what << ": batch " << c.batch << ", m " << c.m << ", n " << c.n << ", k " << c.k
                    << ", trans_a " << ta << ", trans_b " << tb << ", alpha " << c.alpha
                    << ", accumulate " << c.accumulate);
        GemmArgs g;
        g.batch = c.batch;
        g.m = c.m;
        g.n = c.n;
        g.k = c.k;
        g.trans_a = ta;
        g.trans_b = tb;
        g.alpha = c.alpha;
        g.accumulate = c.accumulate;
        auto stride = [&](int64_t size, int64_t pad) { return pad < 0 ? 0 : size + pad; };
        g.stride_a = stride(c.m * c.k, c.pad_a);
        g.stride_b = stride(c.k * c.n, c.pad_b);
        g.stride_c = stride(c.m * c.n, c.pad_c);
        auto extent = [&](int64_t size, int64_t s) { return (c.batch - 1) * s + size; };
        const Tensor a = normal({extent(c.m * c.k, g.stride_a)}, rng);
        const Tensor b = normal({extent(c.k * c.n, g.stride_b)}, rng);
        // C starts with values: they are accumulated into, or (the padding) must survive.
        const Tensor c0 = normal({extent(c.m * c.n, g.stride_c)}, rng);
        check_parity(p, {in("a", a), in("b", b), inout("c", c0)},
                     [&](Backend& be, std::vector<Tensor>& t) { be.gemm(g, t[0], t[1], t[2]); });
      }
}

// The fused classifier's dW and dx: bf16 operands summed into an f32 C over several calls
// (under f64 and f32 an ordinary GEMM). The CPU runs f32 on the same bf16 values.
TEST_CASE("cuda: gemm of bf16 operands into an f32 C, accumulating over calls", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(104);
  for (bool ta : {false, true}) {
    INFO("trans_a " << ta);
    GemmArgs g;
    g.m = 37;
    g.n = 24;
    g.k = 300;
    g.trans_a = ta;
    g.accumulate = true;
    check_parity(p,
                 {in("a", normal({g.m * g.k}, rng)), in("b", normal({g.k * g.n}, rng)),
                  f32_when_bf16(inout("c", normal({g.m * g.n}, rng)))},
                 [&](Backend& be, std::vector<Tensor>& t) {
                   be.gemm(g, t[0], t[1], t[2]);
                   be.gemm(g, t[0], t[1], t[2]);  // a second chunk's share onto the first's
                 });
  }
}

// The GELU MLP's epilogue GEMMs (core/ops/mlp.h): through cuBLASLt's GELU_AUX and DGELU where n
// is a multiple of 8 (f32, bf16), through the GEMM and the GELU kernels elsewhere (f64, odd n);
// both against the CPU's GEMM then GELU. The shapes are those gelu_mlp gives them: the up
// projection x W^T, and dy W_down in backward. The epilogues' GELU is not f32-exact: on an H200
// (cuBLASLt 13.0, 2026-11-28) f32 outputs differed from the CPU's by up to 5e-5 of their rms
// where the GEMM alone agrees to 1e-5, as a hardware tanh approximation would, so Tol::Long.
TEST_CASE("cuda: gemm_gelu and gemm_dgelu against the CPU's GEMM then GELU", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(105);
  struct Case {
    const char* what;
    int64_t m, n, k;
  };
  for (const Case& c : {Case{"aligned (cuBLASLt)", 96, 64, 48}, Case{"one row", 1, 256, 64},
                        Case{"n not a multiple of 8 (fallback)", 33, 17, 65},
                        Case{"long k", 64, 128, 3072}}) {
    INFO(c.what << ": m " << c.m << ", n " << c.n << ", k " << c.k);
    GemmArgs up;
    up.m = c.m;
    up.n = c.n;
    up.k = c.k;
    up.trans_b = true;
    up.stride_a = c.m * c.k;
    up.stride_c = c.m * c.n;
    // Inputs of unit spread over k terms: pre-activations of a few units, GELU's curved part.
    const double std = 1.5 / std::sqrt(static_cast<double>(c.k));
    const int64_t lt_calls = cuda::epilogue_gemm_calls();
    check_parity(p,
                 {in("a", normal({c.m * c.k}, rng)), in("b", normal({c.n * c.k}, rng, std)),
                  out("pre", {c.m * c.n}), out("out", {c.m * c.n})},
                 [&](Backend& be, std::vector<Tensor>& t) { be.gemm_gelu(up, t[0], t[1], t[2], t[3]); },
                 Tol::Long);
    GemmArgs down = up;
    down.trans_b = false;
    check_parity(p,
                 {in("a", normal({c.m * c.k}, rng)), in("b", normal({c.k * c.n}, rng, std)),
                  in("pre", normal({c.m * c.n}, rng, 1.5)), out("out", {c.m * c.n})},
                 [&](Backend& be, std::vector<Tensor>& t) {
                   be.gemm_dgelu(down, t[0], t[1], t[2], t[3]);
                 },
                 Tol::Long);
    // cuBLASLt ran the aligned f32 and bf16 calls, not the fallback (nor on views off 16 bytes).
    const bool epilogue = p.dtype != DType::F64 && c.n % 8 == 0 && offset_bytes(p.dtype) % 16 == 0;
    CHECK((cuda::epilogue_gemm_calls() > lt_calls) == epilogue);
  }
}

// row_scores' kernels: bf16 rows against an f32 weight (f32 and f64: one dtype), the scores,
// dx, and dw written and accumulated; d a multiple of 8 (16-byte loads) and not.
TEST_CASE("cuda: row_scores forward and backward against the CPU's cast then GEMM", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(106);
  for (const auto& [n, d] : std::vector<std::pair<int64_t, int64_t>>{{300, 64}, {37, 29}, {1, 8}}) {
    INFO("n " << n << ", d " << d);
    const Tensor x = normal({n, d}, rng), w = normal({d}, rng, 0.3), dr = normal({n}, rng);
    check_parity(p, {in("x", x), f32_when_bf16(in("w", w)), f32_when_bf16(out("r", {n}))},
                 [](Backend& be, std::vector<Tensor>& t) { be.row_scores_forward(t[0], t[1], t[2]); },
                 Tol::Long);
    for (bool accumulate : {false, true}) {
      INFO("accumulate dx and dw " << accumulate);
      check_parity(p,
                   {in("x", x), f32_when_bf16(in("w", w)), f32_when_bf16(in("dr", dr)),
                    inout("dx", normal({n, d}, rng)), f32_when_bf16(inout("dw", normal({d}, rng)))},
                   [&](Backend& be, std::vector<Tensor>& t) {
                     be.row_scores_backward(t[0], t[1], t[2], t[3], accumulate, t[4], accumulate);
                   },
                   Tol::Long);
    }
  }
}

TEST_CASE("cuda: binary ops, every kind and broadcast", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(104);
  struct Size {
    int64_t outer, inner;
  };
  for (Size s : {Size{37, 129}, Size{1000, 257}, Size{1, 5}, Size{300, 1}})
    for (BinaryKind kind : {BinaryKind::Add, BinaryKind::Sub, BinaryKind::Mul})
      for (Broadcast bc : {Broadcast::Same, Broadcast::Inner, Broadcast::Outer}) {
        INFO("outer " << s.outer << ", inner " << s.inner << ", kind " << static_cast<int>(kind)
                      << " (add, sub, mul), broadcast " << static_cast<int>(bc)
                      << " (same, inner, outer)");
        const int64_t b_size = bc == Broadcast::Same ? s.outer * s.inner
                                                     : (bc == Broadcast::Inner ? s.inner : s.outer);
        check_parity(p,
                     {in("a", normal({s.outer, s.inner}, rng)), in("b", normal({b_size}, rng)),
                      out("out", {s.outer, s.inner})},
                     [&](Backend& be, std::vector<Tensor>& t) {
                       be.binary(kind, bc, s.outer, s.inner, t[0], t[1], t[2]);
                     });
      }
}

TEST_CASE("cuda: scale and axpy", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(105);
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    INFO(n << " elements");
    check_parity(p, {in("x", normal({n}, rng)), out("out", {n})},
                 [](Backend& be, std::vector<Tensor>& t) { be.scale(t[0], -0.75, t[1]); });
    check_parity(p, {in("x", normal({n}, rng)), inout("y", normal({n}, rng))},
                 [](Backend& be, std::vector<Tensor>& t) { be.axpy(1.5, t[0], t[1]); });
  }
}

// Inputs have mean 0.3 so the sums do not cancel to noise; Tol::Long past 10^4 terms per sum.
TEST_CASE("cuda: sum_all, sum_squares, sum_outer and sum_inner", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(106);
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    INFO("sum_all over " << n);
    check_parity(
        p, {in("x", normal({n}, rng, 1.0, 0.3)), out("out", {1})},
        [](Backend& be, std::vector<Tensor>& t) { be.sum_all(t[0], t[1]); },
        n > 10000 ? Tol::Long : Tol::Normal);
    INFO("sum_squares over " << n);
    check_parity(
        p, {in("x", normal({n}, rng, 1.0, 0.3)), out("out", {1})},
        [](Backend& be, std::vector<Tensor>& t) { be.sum_squares(t[0], t[1]); },
        n > 10000 ? Tol::Long : Tol::Normal);
  }
  struct Size {
    int64_t outer, inner;
  };
  for (Size s : {Size{1000, 37}, Size{3, 5000}, Size{20000, 3}, Size{1, 1}, Size{7, 1}}) {
    INFO("sum_outer, outer " << s.outer << ", inner " << s.inner);
    check_parity(
        p, {in("x", normal({s.outer, s.inner}, rng, 1.0, 0.3)), out("out", {s.inner})},
        [&](Backend& be, std::vector<Tensor>& t) { be.sum_outer(s.outer, s.inner, t[0], t[1]); },
        s.outer > 10000 ? Tol::Long : Tol::Normal);
  }
  for (Size s : {Size{37, 1000}, Size{5, 20000}, Size{1000, 1}, Size{3, 7}, Size{1, 1}}) {
    INFO("sum_inner, outer " << s.outer << ", inner " << s.inner);
    check_parity(
        p, {in("x", normal({s.outer, s.inner}, rng, 1.0, 0.3)), out("out", {s.outer})},
        [&](Backend& be, std::vector<Tensor>& t) { be.sum_inner(s.outer, s.inner, t[0], t[1]); },
        s.inner > 10000 ? Tol::Long : Tol::Normal);
  }
}

// Zero-sized calls launch nothing, except where the empty reduction defines values: a sum over
// no elements is 0, and sum_outer over zero rows writes zeros to every column.
TEST_CASE("cuda: zero-sized calls", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(107);
  check_parity(p, {in("x", normal({0}, rng)), out("out", {1})},
               [](Backend& be, std::vector<Tensor>& t) { be.sum_all(t[0], t[1]); });
  check_parity(p, {in("x", normal({0}, rng)), out("out", {1})},
               [](Backend& be, std::vector<Tensor>& t) { be.sum_squares(t[0], t[1]); });
  check_parity(p, {in("x", normal({0, 5}, rng)), out("out", {5})},
               [](Backend& be, std::vector<Tensor>& t) { be.sum_outer(0, 5, t[0], t[1]); });
  check_parity(p, {in("x", normal({5, 0}, rng)), out("out", {5})},
               [](Backend& be, std::vector<Tensor>& t) { be.sum_inner(5, 0, t[0], t[1]); });
  check_parity(p, {in("a", normal({0, 4}, rng)), in("b", normal({4}, rng)), out("out", {0, 4})},
               [](Backend& be, std::vector<Tensor>& t) {
                 be.binary(BinaryKind::Add, Broadcast::Inner, 0, 4, t[0], t[1], t[2]);
               });
  check_parity(p, {in("x", normal({0}, rng)), out("out", {0})},
               [](Backend& be, std::vector<Tensor>& t) { be.scale(t[0], 2.0, t[1]); });
  GemmArgs g;
  g.batch = 2;
  g.m = 0;
  g.n = 3;
  g.k = 4;
  g.stride_b = 12;
  check_parity(p, {in("a", normal({0}, rng)), in("b", normal({24}, rng)), out("c", {0})},
               [&](Backend& be, std::vector<Tensor>& t) { be.gemm(g, t[0], t[1], t[2]); });
}
