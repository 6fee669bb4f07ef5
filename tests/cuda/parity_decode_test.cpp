// The decode family on the GPU against the CPU (core/ops/decode.h): the masked cache append,
// decode attention over ragged lengths (an empty cache included), the masked residual add, the
// admit flags, sample_tokens (greedy, temperature, top-k, top-p; the same draws as the CPU's, so
// a sequence samples the same tokens on either device), the step's bookkeeping, and run_if_any's
// conditional graph node.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/all_ops.h"
#include "tests/cuda/backend_parity.h"

using namespace mod;
using namespace mod::parity;

TEST_CASE("cuda: kv_cache_append and decode_attention over ragged lengths", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  const int64_t dh = GENERATE(16, 64);
  Rng rng(401);
  const int64_t b = 4, s = 37, h = 3;
  const Tensor len = indices({5, 0, 36, 37}, {b});
  for (bool gathered : {false, true}) {
    INFO(dtype_name(p.dtype) << ", Dh " << dh << (gathered ? ", rows {3, 0}" : ""));
    const int64_t n = gathered ? 2 : b;
    const Tensor rows = gathered ? indices({3, 0}, {2}) : Tensor();
    auto rows_arg = [&] { return in("rows", gathered ? rows : indices({0, 1, 2, 3}, {b})); };
    check_parity(p,
                 {in("k", normal({n, 1, h, dh}, rng)), in("v", normal({n, 1, h, dh}, rng)),
                  in("admit", gathered ? indices({1, 1}, {2}) : indices({1, 1, 0, 1}, {b})),
                  rows_arg(), inout("len", len), inout("k_cache", normal({b, s, h, dh}, rng)),
                  inout("v_cache", normal({b, s, h, dh}, rng))},
                 [](Backend& be, std::vector<Tensor>& t) {
                   be.kv_cache_append(t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
                 });
    check_parity(p,
                 {in("q", normal({n, h, dh}, rng)), in("k_cache", normal({b, s, h, dh}, rng)),
                  in("v_cache", normal({b, s, h, dh}, rng)), in("len", len), rows_arg(),
                  out("out", {n, h, dh})},
                 [](Backend& be, std::vector<Tensor>& t) {
                   be.decode_attention(t[0], t[1], t[2], t[3], t[4], t[5]);
                 },
                 Tol::Long);
  }
}

TEST_CASE("cuda: decode_admit and masked_add", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(402);
  INFO(dtype_name(p.dtype));
  const int64_t b = 300, d = 48;
  std::vector<int64_t> active(b), admit(b);
  for (int64_t i = 0; i < b; ++i) active[i] = rng.below(2), admit[i] = rng.below(2);
  check_parity(p,
               {in("decision", normal({b}, rng)), in("active", indices(active, {b})),
                out("admit", {b}, DType::I64)},
               [](Backend& be, std::vector<Tensor>& t) { be.decode_admit(t[0], t[1], t[2]); });
  check_parity(p,
               {in("x", normal({b, 1, d}, rng)), in("u", normal({b, 1, d}, rng)),
                in("admit", indices(admit, {b})), out("out", {b, 1, d})},
               [](Backend& be, std::vector<Tensor>& t) { be.masked_add(t[0], t[1], t[2], t[3]); });
}

TEST_CASE("cuda: sample_tokens draws the CPU's tokens", "[cuda]") {
  const Precision p = precision(GENERATE(MOD_PARITY_DTYPES));
  Rng rng(403);
  const int64_t b = 64, v = 50257;
  std::vector<int64_t> pos(b);
  for (int64_t i = 0; i < b; ++i) pos[i] = rng.below(1000);
  Tensor logits = normal({b, v}, rng, 3.0);
  logits.data<double>()[5 * v + 7] = std::nan("");  // rows with a NaN or an infinity: the marker
  logits.data<double>()[9 * v + v - 1] = INFINITY;
  logits.data<double>()[12 * v] = -INFINITY;
  struct Case {
    double temperature;
    int64_t top_k;
    double top_p;
  };
  for (const Case c : {Case{0, 0, 1}, Case{1, 0, 1}, Case{0.8, 40, 1}, Case{1, 0, 0.9},
                       Case{0.7, 50, 0.95}, Case{1.3, 1, 1}}) {
    INFO(dtype_name(p.dtype) << ", temperature " << c.temperature << ", top_k " << c.top_k
                             << ", top_p " << c.top_p);
    SampleArgs a;
    a.temperature = c.temperature;
    a.top_k = c.top_k;
    a.top_p = c.top_p;
    a.seed = 11;
    a.first_stream = 3;
    check_parity(p,
                 {in("logits", logits), in("pos", indices(pos, {b})),
                  out("next", {b}, DType::I64)},
                 [a](Backend& be, std::vector<Tensor>& t) {
                   be.sample_tokens(t[0], t[1], a, t[2]);
                 });
  }
}

TEST_CASE("cuda: decode_advance", "[cuda]") {
  const Precision p = precision(DType::F32);
  const int64_t b = 3, l = 6;
  check_parity(p,
               {in("next", indices({7, kNonFiniteLogitsToken, 9}, {b})), in("prompt_len", indices({1, 4, 2}, {b})),
                in("stop", indices({5, 5, 2}, {b})),
                inout("tokens", indices({1, 0, 0, 0, 0, 0, 2, 3, 4, 5, 0, 0, 6, 7, 0, 0, 0, 0},
                                        {b, l})),
                inout("pos", indices({0, 1, 1}, {b})), inout("cur", indices({1, 3, 7}, {b})),
                inout("active", indices({1, 1, 1}, {b}))},
               [](Backend& be, std::vector<Tensor>& t) {
                 be.decode_advance(t[0], t[1], t[2], 9, t[3], t[4], t[5], t[6]);
               });
}

// A routed block's work in a captured decode step sits behind run_if_any: the conditional node
// runs its body (a cuBLAS GEMM and a kernel, captured on the side stream) only at replays where
// a flag is set; work after it always runs, after the body. Eagerly the body always runs.
// cublasSetStream "unconditionally resets the cuBLAS library workspace back to the default
// workspace pool" (cuBLAS guide), and a GEMM on the default pool allocates inside a capture,
// which a conditional body forbids. run_if_any's body is captured on a side stream after a
// StreamOverride: the fixed workspace must be bound again there (and back on the compute
// stream after), or this GPT-2-small MLP GEMM at decode batch 64 fails the capture.
TEST_CASE("cuda: a GPT-2-sized bf16 GEMM captures inside run_if_any's body and after it",
          "[cuda]") {
  Backend& be = backend(Device::CUDA);
  Rng rng(406);
  const Tensor x = normal({64, 768}, rng).to(DType::BF16).to(Device::CUDA);
  const Tensor w = normal({768, 3072}, rng, 0.03).to(DType::BF16).to(Device::CUDA);
  const std::vector<double> want = matmul(x, w).to(Device::CPU).to_vector();  // eager
  const Tensor flags = Tensor::from_indices({1}, {1}).to(Device::CUDA);
  Tensor inside = Tensor::zeros({64, 3072}, DType::BF16, Device::CUDA);
  Tensor after = Tensor::zeros({64, 3072}, DType::BF16, Device::CUDA);
  be.begin_capture();
  be.run_if_any(flags, [&] { inside.copy_from(matmul(x, w)); });
  after.copy_from(matmul(x, w));
  const std::unique_ptr<CapturedWork> graph = be.end_capture();
  graph->replay();
  CHECK(inside.to(Device::CPU).to_vector() == want);
  CHECK(after.to(Device::CPU).to_vector() == want);
}

TEST_CASE("cuda: run_if_any in a captured graph runs its body only when a flag is set",
          "[cuda]") {
  Backend& be = backend(Device::CUDA);
  Rng rng(405);
  const Tensor a = normal({8, 16}, rng).to(DType::F32).to(Device::CUDA);
  const Tensor b = normal({16, 4}, rng).to(DType::F32).to(Device::CUDA);
  const std::vector<double> ab = matmul(a, b).to(Device::CPU).to_vector();  // eager reference
  Tensor flags = Tensor::zeros({3}, DType::I64, Device::CUDA);
  Tensor product = Tensor::zeros({8, 4}, DType::F32, Device::CUDA);
  Tensor count = Tensor::zeros({1}, DType::F32, Device::CUDA);
  const Tensor one = Tensor::full({1}, 1.0, DType::F32, Device::CUDA);
  be.begin_capture();
  be.run_if_any(flags, [&] {
    product.copy_from(matmul(a, b));
    be.axpy(1.0, one, count);
  });
  be.axpy(100.0, count, count);  // after the body: sees its increment
  const std::unique_ptr<CapturedWork> graph = be.end_capture();

  double want = 0;
  for (const std::vector<int64_t>& set : std::vector<std::vector<int64_t>>{
           {0, 0, 0}, {0, 0, 1}, {0, 0, 0}, {1, 1, 1}}) {
    const bool any = set != std::vector<int64_t>{0, 0, 0};
    INFO("flags " << set[0] << set[1] << set[2]);
    flags.copy_from(Tensor::from_indices(set, {3}));
    graph->replay();
    want = 101.0 * (want + (any ? 1.0 : 0.0));
    CHECK(count.to(Device::CPU).to_vector() == std::vector<double>{want});
    const std::vector<double> got = product.to(Device::CPU).to_vector();
    if (!any && want == 0) CHECK(got == std::vector<double>(32, 0.0));  // never ran yet
    if (any) CHECK(got == ab);
  }
  Tensor zeros = Tensor::zeros({3}, DType::I64, Device::CUDA);
  be.run_if_any(zeros, [&] { be.axpy(1.0, one, count); });  // eager: runs regardless
  CHECK(count.to(Device::CPU).to_vector() == std::vector<double>{want + 1});
}

// Where the driver refuses conditional handles (older than the toolkit), run_if_any captures its
// body inline, once noted: every replay runs it, as an eager step does, and the capture still
// succeeds. Hidden: its CTest entry makes the emulator refuse the handle
// (MOD_EMU_NO_CONDITIONAL_NODES=1) and looks for the note.
TEST_CASE("cuda: run_if_any without conditional nodes captures its body inline",
          "[cuda][.no_conditional_nodes]") {
  Backend& be = backend(Device::CUDA);
  const Tensor flags = Tensor::zeros({2}, DType::I64, Device::CUDA);
  Tensor count = Tensor::zeros({1}, DType::F32, Device::CUDA);
  const Tensor one = Tensor::full({1}, 1.0, DType::F32, Device::CUDA);
  be.begin_capture();
  be.run_if_any(flags, [&] { be.axpy(1.0, one, count); });
  const std::unique_ptr<CapturedWork> graph = be.end_capture();
  graph->replay();
  graph->replay();
  CHECK(count.to(Device::CPU).to_vector() == std::vector<double>{2.0});
}
