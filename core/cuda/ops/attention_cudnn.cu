// cuDNN fused causal attention through the cuDNN 9 backend (graph) API, for bf16 self-attention
// whose mask is causal by index. Shapes: B batch, T tokens (= S keys), H heads, Dh head width.
//
// cuDNN 9.19's dedicated SDPA_FWD/BWD operations have no mask attribute (cudnn-frontend attaches
// causal masks to them only from 9.21, as a subgraph), so each pass is spelled as the graph of
// primitive operations that cudnn-frontend's composite SDPA node lowers to, and that cuDNN's
// fused-attention engines recognise and run as one flash-attention kernel:
//   forward:  S = (Q K^T) * scale; causal mask (GEN_INDEX row, col; CMP_GE; BINARY_SELECT -inf);
//             M = rowmax S; E = exp(S - M); Z = rowsum E; lse = M + log Z; O = (E / Z) V
//   backward: D = rowsum(dO * O); E = exp(mask(S) - lse); dV = E^T dO;
//             dS = E * (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K (accumulated in f32)
// cuDNN chooses the tiling and thread layout; no modtrain kernel runs here. Finalised plans are
// cached per (B, T, H, Dh, direction), so a training step builds each graph once. Any failure
// before a plan exists makes the call return false, having launched nothing (printed once per
// shape); a failure while executing a plan throws.
#include <cuda_runtime.h>
#include <cudnn_graph.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/ops/attention_cudnn.h"
#include "core/cuda/ops/cudnn_graph.h"
#include "core/cuda/stream.h"

// A failed cuDNN call while running a finalised plan: throws naming the call.
#define MOD_CUDNN_EXEC_CHECK(call)                                       \
  do {                                                                   \
    const cudnnStatus_t mod_st_ = (call);                                \
    if (mod_st_ != CUDNN_STATUS_SUCCESS)                                 \
      ::mod::cuda::fail(#call, __FILE__, __LINE__, cudnn_text(mod_st_)); \
  } while (0)

namespace mod::cuda {
namespace {

using cudnn::BuildError;
using cudnn::check_build;
using cudnn::cudnn_text;
using cudnn::Dims;
using cudnn::GraphBuilder;
using cudnn::kAlignment;

// 9.0 is the floor: this file links libcudnn.so.9, so 8.9.5 (the first cuDNN with these fused
// engines) can never be loaded, and 9.x drops the 8.9 workarounds (padding when T % 64 != 0).
constexpr size_t kMinVersion = 90000;
constexpr int64_t kSegmentAlign = 256;  // bytes between the pieces of the workspace

// Unique ids of the tensors bound at execution (virtual ones start at cudnn::kFirstVirtual).
// Scale, NegInf and One are f32 scalars passed by value (host pointers in the variant pack);
// SoftmaxSum (rowsum(dO * O), f32 [B,H,T,1]) and DQAccum (dQ in f32, [B,H,T,Dh] packed) live in
// the backward's workspace.
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kStats = 5, kDO = 6, kDQ = 7, kDK = 8, kDV = 9;
constexpr int64_t kScale = 10, kNegInf = 11, kOne = 12, kSoftmaxSum = 13, kDQAccum = 14;

// Two spellings of the same graph. kCurrent is what cudnn-frontend emits for cuDNN 9.10..9.20
// (mask after the stats subtraction in backward, GEN_INDEX computed in f32, -inf fill); kLegacy
// is the mid-2024 spelling (mask before it, GEN_INDEX in i32, rowsum(dO*O) virtual, dP * 1).
// cuDNN's pattern matcher has accepted each in its day; the first one it takes wins.
enum class Spelling { kCurrent, kLegacy };

// The layouts of one problem size in cuDNN's (b, h, s, d) dimension order.
struct Layout {
  int64_t B, T, H, Dh;
  Dims bhsd() const { return {B, H, T, Dh}; }
  // q, k, v, out and their gradients are [B,T,H,Dh] contiguous ("BSHD").
  Dims bshd_strides() const { return {T * H * Dh, Dh, H * Dh, 1}; }
  // K^T (and V^T): the same memory read as [B,H,Dh,T].
  Dims transposed() const { return {B, H, Dh, T}; }
  Dims transposed_strides() const { return {T * H * Dh, Dh, 1, H * Dh}; }
  // Scores [B,H,T,T] (virtual) and their transpose [B,H,T(keys),T(queries)].
  Dims scores() const { return {B, H, T, T}; }
  Dims scores_strides() const { return {H * T * T, T * T, T, 1}; }
  Dims scores_t_strides() const { return {H * T * T, T * T, 1, T}; }
  // Per-query rows [B,H,T,1]: lse is [B,H,T] contiguous f32, exactly this.
  Dims rows() const { return {B, H, T, 1}; }
  Dims rows_strides() const { return {H * T, T, 1, 1}; }
  Dims packed_strides() const { return {H * T * Dh, T * Dh, Dh, 1}; }
};

// y = x where query index >= key index, else the fill scalar (causal by index, top-left aligned).
cudnnBackendDescriptor_t causal_mask(GraphBuilder& g, const Layout& L, Spelling spelling,
                                     cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t fill) {
  const cudnnDataType_t index_math =
      spelling == Spelling::kCurrent ? CUDNN_DATA_FLOAT : CUDNN_DATA_INT32;
  cudnnBackendDescriptor_t row = g.virt(CUDNN_DATA_INT32, L.scores(), L.scores_strides());
  cudnnBackendDescriptor_t col = g.virt(CUDNN_DATA_INT32, L.scores(), L.scores_strides());
  cudnnBackendDescriptor_t keep = g.virt(CUDNN_DATA_BOOLEAN, L.scores(), L.scores_strides());
  cudnnBackendDescriptor_t y = g.virt(CUDNN_DATA_FLOAT, L.scores(), L.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_math, x, nullptr, nullptr, row, /*axis=*/2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, index_math, x, nullptr, nullptr, col, /*axis=*/3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, fill, keep, y);
  return y;
}

// Forward graph: binds Q, K (as K^T), V, O, Stats (= lse), Scale, NegInf.
void build_forward(GraphBuilder& g, const Layout& L, Spelling spelling) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t q = g.tensor(kQ, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t kt = g.tensor(kK, bf16, L.transposed(), L.transposed_strides());
  cudnnBackendDescriptor_t v = g.tensor(kV, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t o = g.tensor(kO, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t stats = g.tensor(kStats, f32, L.rows(), L.rows_strides());
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t neg_inf = g.scalar(kNegInf);

  cudnnBackendDescriptor_t s_raw = g.virt(f32, L.scores(), L.scores_strides());
  g.matmul(q, kt, s_raw);
  cudnnBackendDescriptor_t s = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_MUL, s_raw, scale, s);
  cudnnBackendDescriptor_t masked = causal_mask(g, L, spelling, s, neg_inf);

  // Softmax with its statistics: lse = max + log(sum exp(s - max)).
  cudnnBackendDescriptor_t row_max = g.virt(f32, L.rows(), L.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  cudnnBackendDescriptor_t shifted = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_SUB, masked, row_max, shifted);
  cudnnBackendDescriptor_t e = g.virt(f32, L.scores(), L.scores_strides());
  g.unary(CUDNN_POINTWISE_EXP, shifted, e);
  cudnnBackendDescriptor_t row_sum = g.virt(f32, L.rows(), L.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  cudnnBackendDescriptor_t log_sum = g.virt(f32, L.rows(), L.rows_strides());
  g.unary(CUDNN_POINTWISE_LOG, row_sum, log_sum);
  g.binary(CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  // The probabilities enter the second matmul in the i/o type, as the engines require.
  cudnnBackendDescriptor_t p = g.virt(bf16, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_DIV, e, row_sum, p);
  g.matmul(p, v, o);
}

// Backward graph: binds Q, K (as K^T), V (as V^T), O, dO, Stats (= lse), dQ, dK, dV, Scale,
// NegInf, One, DQAccum and, in the current spelling, SoftmaxSum.
void build_backward(GraphBuilder& g, const Layout& L, Spelling spelling) {
  const cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, f32 = CUDNN_DATA_FLOAT;
  const bool current = spelling == Spelling::kCurrent;
  cudnnBackendDescriptor_t q = g.tensor(kQ, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t kt = g.tensor(kK, bf16, L.transposed(), L.transposed_strides());
  cudnnBackendDescriptor_t vt = g.tensor(kV, bf16, L.transposed(), L.transposed_strides());
  cudnnBackendDescriptor_t o = g.tensor(kO, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t d_o = g.tensor(kDO, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t stats = g.tensor(kStats, f32, L.rows(), L.rows_strides());
  cudnnBackendDescriptor_t d_q = g.tensor(kDQ, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t d_k = g.tensor(kDK, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t d_v = g.tensor(kDV, bf16, L.bhsd(), L.bshd_strides());
  cudnnBackendDescriptor_t scale = g.scalar(kScale);
  cudnnBackendDescriptor_t neg_inf = g.scalar(kNegInf);
  cudnnBackendDescriptor_t one = g.scalar(kOne);

  // D = rowsum(dO * O) [B,H,T,1].
  cudnnBackendDescriptor_t o_do = g.virt(f32, L.bhsd(), L.packed_strides());
  g.binary(CUDNN_POINTWISE_MUL, d_o, o, o_do);
  cudnnBackendDescriptor_t o_do_sum = g.virt(f32, L.rows(), L.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, o_do, o_do_sum);
  cudnnBackendDescriptor_t softmax_sum =
      current ? g.tensor(kSoftmaxSum, f32, L.rows(), L.rows_strides())
              : g.virt(f32, L.rows(), L.rows_strides());
  g.binary(CUDNN_POINTWISE_MUL, o_do_sum, one, softmax_sum);

  // E = exp(mask(S * scale) - lse): the forward's probabilities, recomputed.
  cudnnBackendDescriptor_t s_raw = g.virt(f32, L.scores(), L.scores_strides());
  g.matmul(q, kt, s_raw);
  cudnnBackendDescriptor_t s = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_MUL, s_raw, scale, s);
  cudnnBackendDescriptor_t logits = nullptr;
  if (current) {
    cudnnBackendDescriptor_t centred = g.virt(f32, L.scores(), L.scores_strides());
    g.binary(CUDNN_POINTWISE_SUB, s, stats, centred);
    logits = causal_mask(g, L, spelling, centred, neg_inf);
  } else {
    cudnnBackendDescriptor_t masked = causal_mask(g, L, spelling, s, neg_inf);
    logits = g.virt(f32, L.scores(), L.scores_strides());
    g.binary(CUDNN_POINTWISE_SUB, masked, stats, logits);
  }
  cudnnBackendDescriptor_t e = g.virt(f32, L.scores(), L.scores_strides());
  g.unary(CUDNN_POINTWISE_EXP, logits, e);

  // dV = E^T dO.
  cudnnBackendDescriptor_t e_t = g.virt(bf16, L.scores(), L.scores_t_strides());
  g.reshape(e, e_t);
  g.matmul(e_t, d_o, d_v);

  // dS = E * (dO V^T - D) * scale.
  cudnnBackendDescriptor_t dp = g.virt(f32, L.scores(), L.scores_strides());
  g.matmul(d_o, vt, dp);
  if (!current) {
    cudnnBackendDescriptor_t dp_kept = g.virt(f32, L.scores(), L.scores_strides());
    g.binary(CUDNN_POINTWISE_MUL, dp, one, dp_kept);  // the dropout mask's place, all ones
    dp = dp_kept;
  }
  cudnnBackendDescriptor_t dp_centred = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centred);
  cudnnBackendDescriptor_t ds_unscaled = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_MUL, dp_centred, e, ds_unscaled);
  cudnnBackendDescriptor_t ds = g.virt(f32, L.scores(), L.scores_strides());
  g.binary(CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);

  // dK = dS^T Q.
  cudnnBackendDescriptor_t ds_t = g.virt(bf16, L.scores(), L.scores_t_strides());
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, d_k);

  // dQ = dS K, accumulated in f32 in the workspace, then converted.
  cudnnBackendDescriptor_t k = g.virt(bf16, L.bhsd(), L.bshd_strides());
  g.reshape(kt, k);
  cudnnBackendDescriptor_t dq_accum = g.tensor(kDQAccum, f32, L.bhsd(), L.packed_strides());
  g.matmul(ds, k, dq_accum);
  g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, d_q);
}

// A finalised plan and everything it was built from. Never destroyed (see state()).
struct Plan {
  std::vector<cudnnBackendDescriptor_t> descriptors;
  cudnnBackendDescriptor_t exec = nullptr;
  int64_t engine_workspace = 0;           // bytes cuDNN asks for
  bool binds_softmax_sum = false;         // backward, current spelling
  float scale = 0, neg_inf = 0, one = 1;  // the by-value scalars' host storage
};

using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, bool>;  // B, T, H, Dh, backward

struct State {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
  bool handle_failed = false;
  cudaStream_t bound_stream = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;  // nullptr: cuDNN refused this shape
};

// Heap-allocated and never freed: at exit cuDNN and the CUDA context may already be gone, and
// destroying descriptors then would fail or crash.
State& state() {
  static State* s = new State();
  return *s;
}

std::string describe_shape(const Layout& L, bool backward) {
  return std::string(backward ? "backward" : "forward") + " [B,T,H,Dh] = [" + std::to_string(L.B) +
         ", " + std::to_string(L.T) + ", " + std::to_string(L.H) + ", " + std::to_string(L.Dh) +
         "]";
}

void report_unavailable(const std::string& shape, const std::string& reason) {
  std::fprintf(stderr,
               "modtrain: cuDNN attention unavailable for %s: %s; using modtrain's kernel\n",
               shape.c_str(), reason.c_str());
}

// The process's handle bound to compute_stream(), or nullptr (reported once) if cuDNN cannot
// make one. Called with the state's mutex held.
cudnnHandle_t acquire_handle(State& st, const std::string& shape) {
  if (st.handle_failed) return nullptr;
  const cudaStream_t stream = compute_stream();
  if (st.handle == nullptr) {
    const cudnnStatus_t status = cudnnCreate(&st.handle);
    if (status != CUDNN_STATUS_SUCCESS) {
      st.handle = nullptr;
      st.handle_failed = true;
      report_unavailable(shape, "cudnnCreate: " + cudnn_text(status));
      return nullptr;
    }
  }
  if (st.bound_stream != stream) {
    MOD_CUDNN_EXEC_CHECK(cudnnSetStream(st.handle, stream));
    st.bound_stream = stream;
  }
  return st.handle;
}

// The cached plan for this shape, building it on first use; nullptr if cuDNN refuses it.
// Called with the state's mutex held.
Plan* plan_for(State& st, cudnnHandle_t handle, const Layout& L, bool backward) {
  const PlanKey key{L.B, L.T, L.H, L.Dh, backward};
  if (auto it = st.plans.find(key); it != st.plans.end()) return it->second.get();

  const size_t version = cudnnGetVersion();
  auto plan = std::make_unique<Plan>();
  plan->scale = 1.0f / std::sqrt(static_cast<float>(L.Dh));
  std::string reasons;
  for (const Spelling spelling : {Spelling::kCurrent, Spelling::kLegacy}) {
    // The mask fill: the lowest finite value before 9.10 and in the legacy spelling, else -inf.
    // Either way masked scores become exactly 0 after exp (the diagonal keeps every row alive).
    plan->neg_inf = spelling == Spelling::kLegacy || version < 91000
                        ? std::numeric_limits<float>::lowest()
                        : -std::numeric_limits<float>::infinity();
    try {
      GraphBuilder g(handle);
      if (backward)
        build_backward(g, L, spelling);
      else
        build_forward(g, L, spelling);
      cudnnBackendDescriptor_t exec = g.finalize_plan();
      int64_t workspace = 0, count = 0;
      check_build(cudnnBackendGetAttribute(exec, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &count, &workspace),
                  "plan workspace size");
      plan->exec = exec;
      plan->engine_workspace = workspace;
      plan->binds_softmax_sum = backward && spelling == Spelling::kCurrent;
      plan->descriptors = g.release();
      break;
    } catch (const BuildError& e) {
      if (!reasons.empty()) reasons += "; ";
      reasons += (spelling == Spelling::kCurrent ? "current graph: " : "legacy graph: ") + e.what;
    }
  }
  if (plan->exec == nullptr) {
    report_unavailable(describe_shape(L, backward), reasons);
    plan.reset();
  }
  Plan* result = plan.get();
  st.plans.emplace(key, std::move(plan));
  return result;
}

int64_t align_up(int64_t bytes, int64_t to) {
  return (bytes + to - 1) / to * to;
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kAlignment == 0;
}

// The shared applicability test: bf16 q, k, v on the device, T == S, causal by index, Dh % 8 == 0
// and Dh <= 128, an f32 lse, a cuDNN without known attention bugs. Fills L.
bool applies(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
             const Tensor& k_pos, const Tensor& lse, Layout& L) {
  if (q.device() != Device::CUDA || q.dim() != 4 || k.dim() != 4) return false;
  if (q.dtype() != DType::BF16 || k.dtype() != DType::BF16 || v.dtype() != DType::BF16)
    return false;
  if (lse.dtype() != DType::F32) return false;  // cuDNN's stats are f32
  L = Layout{q.size(0), q.size(1), q.size(2), q.size(3)};
  if (k.size(1) != L.T) return false;
  if (q_pos.raw_data() != k_pos.raw_data()) return false;  // same positions: causal by index
  if (L.Dh % 8 != 0 || L.Dh > 128) return false;
  if (L.B == 0 || L.T == 0 || L.H == 0) return false;
  // 9.10.0 and 9.10.1 compute bf16 attention wrongly (cudnn-frontend refuses them too).
  const size_t version = cudnnGetVersion();
  return version >= kMinVersion && version != 91000 && version != 91001;
}

// Runs a plan with the given bindings and workspace on compute_stream(); throws on failure.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             std::vector<void*>& pointers, void* workspace) {
  struct PackGuard {
    cudnnBackendDescriptor_t d = nullptr;
    ~PackGuard() {
      if (d != nullptr) cudnnBackendDestroyDescriptor(d);
    }
  } pack;
  MOD_CUDNN_EXEC_CHECK(
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack.d));
  MOD_CUDNN_EXEC_CHECK(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()),
                                                uids.data()));
  MOD_CUDNN_EXEC_CHECK(
      cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                               static_cast<int64_t>(pointers.size()), pointers.data()));
  MOD_CUDNN_EXEC_CHECK(cudnnBackendSetAttribute(pack.d, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                                CUDNN_TYPE_VOID_PTR, 1, &workspace));
  MOD_CUDNN_EXEC_CHECK(cudnnBackendFinalize(pack.d));
  MOD_CUDNN_EXEC_CHECK(cudnnBackendExecute(handle, plan.exec, pack.d));
}

// Device scratch of at least `bytes` from the caching allocator (empty when bytes == 0).
Tensor scratch(int64_t bytes) {
  if (bytes <= 0) return Tensor();
  return Tensor::empty({align_up(bytes, 4) / 4}, DType::F32, Device::CUDA);
}

}  // namespace

// q [B,T,H,Dh], k, v [B,T,H,Dh] bf16 -> out [B,T,H,Dh] bf16, lse [B,H,T] f32 (kept for backward).
bool cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                             const Tensor& k_pos, Tensor& out, Tensor& lse) {
  Layout L{};
  if (!applies(q, k, v, q_pos, k_pos, lse, L) || out.dtype() != DType::BF16) return false;
  void* bound[] = {q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data()};
  for (const void* p : bound)
    if (!aligned(p)) return false;

  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  cudnnHandle_t handle = acquire_handle(st, describe_shape(L, false));
  if (handle == nullptr) return false;
  Plan* plan = plan_for(st, handle, L, false);
  if (plan == nullptr) return false;

  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
  std::vector<void*> pointers = {bound[0], bound[1],     bound[2],      bound[3],
                                 bound[4], &plan->scale, &plan->neg_inf};
  Tensor workspace = scratch(plan->engine_workspace);
  execute(handle, *plan, uids, pointers, workspace.defined() ? workspace.raw_data() : nullptr);
  return true;
}

// Inputs as in forward plus out, lse [B,H,T] f32 and dout [B,T,H,Dh] bf16 -> dq, dk, dv
// [B,T,H,Dh] bf16 (overwritten).
bool cudnn_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& q_pos, const Tensor& k_pos, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                              Tensor& dv) {
  Layout L{};
  if (!applies(q, k, v, q_pos, k_pos, lse, L)) return false;
  if (out.dtype() != DType::BF16 || dout.dtype() != DType::BF16 || dq.dtype() != DType::BF16 ||
      dk.dtype() != DType::BF16 || dv.dtype() != DType::BF16)
    return false;
  const size_t version = cudnnGetVersion();
  // Up to 9.15 the backward engines need a padding mask unless T % 128 == 0 (cudnn-frontend
  // adds one); rather than bind per-batch lengths, leave those shapes to modtrain's kernel.
  // T == 1 has no backward engine at all.
  if ((version <= 91500 && L.T % 128 != 0) || L.T == 1) return false;
  void* bound[] = {q.raw_data(),   k.raw_data(),  v.raw_data(),  out.raw_data(), dout.raw_data(),
                   lse.raw_data(), dq.raw_data(), dk.raw_data(), dv.raw_data()};
  for (const void* p : bound)
    if (!aligned(p)) return false;

  State& st = state();
  std::lock_guard<std::mutex> lock(st.mutex);
  cudnnHandle_t handle = acquire_handle(st, describe_shape(L, true));
  if (handle == nullptr) return false;
  Plan* plan = plan_for(st, handle, L, true);
  if (plan == nullptr) return false;

  // Workspace: cuDNN's own, then rowsum(dO * O) (current spelling), then dQ in f32.
  const int64_t softmax_sum_at = align_up(plan->engine_workspace, kSegmentAlign);
  const int64_t softmax_sum_bytes =
      plan->binds_softmax_sum ? L.B * L.H * L.T * static_cast<int64_t>(sizeof(float)) : 0;
  const int64_t dq_accum_at = align_up(softmax_sum_at + softmax_sum_bytes, kSegmentAlign);
  const int64_t dq_accum_bytes = L.B * L.H * L.T * L.Dh * static_cast<int64_t>(sizeof(float));
  Tensor workspace = scratch(dq_accum_at + dq_accum_bytes);
  char* base = static_cast<char*>(workspace.raw_data());
  void* dq_accum = base + dq_accum_at;
  // cuDNN zeroes the f32 dQ accumulator itself from 9.6; before, the caller must.
  if (version < 90600)
    MOD_CUDA_CHECK(
        cudaMemsetAsync(dq_accum, 0, static_cast<size_t>(dq_accum_bytes), compute_stream()));

  std::vector<int64_t> uids = {kQ,  kK,  kV,     kO,      kDO,  kStats,  kDQ,
                               kDK, kDV, kScale, kNegInf, kOne, kDQAccum};
  std::vector<void*> pointers = {bound[0],       bound[1],   bound[2], bound[3], bound[4],
                                 bound[5],       bound[6],   bound[7], bound[8], &plan->scale,
                                 &plan->neg_inf, &plan->one, dq_accum};
  if (plan->binds_softmax_sum) {
    uids.push_back(kSoftmaxSum);
    pointers.push_back(base + softmax_sum_at);
  }
  execute(handle, *plan, uids, pointers, plan->engine_workspace > 0 ? base : nullptr);
  return true;
}

}  // namespace mod::cuda
