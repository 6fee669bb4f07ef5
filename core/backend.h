// Backend: the kernels one device runs. Autograd and model code sit above this interface and
// never name a device; backend(device) is the only place that picks the implementation.
// The CPU backend implements each family in core/cpu/ops/<family>.cpp; a CUDA backend does the
// same in core/cuda/ops/<family>.cu.
//
// Conventions for every kernel:
// - Tensors are contiguous, on this backend's device, with float dtype f32 or f64 unless said
//   otherwise (index tensors: i32 or i64). Callers (core/ops/*.cpp) validate shapes and dtypes;
//   kernels trust them.
// - Outputs are preallocated by the caller and overwritten, except where a kernel says it
//   accumulates (+=).
// Shape legend: B batch, T tokens (queries), S keys, H heads, Dh head dim, D width, V vocabulary,
// N rows (all leading dims flattened), C selected rows per batch entry.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mod {

// C[batch] (+)= alpha * op(A[batch]) @ op(B[batch]); row-major, op = transpose when trans_*.
// A is [M,K] ([K,M] when trans_a), B is [K,N] ([N,K] when trans_b), C is [M,N]. A batch stride
// of 0 reuses the same matrix for every batch entry (a weight shared over the batch).
// A, B and C share one dtype, except that C may be f32 when A and B are bf16 (a CUDA backend:
// gradients summed in f32 over several calls, as the fused classifier's dW).
struct GemmArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch entries
  double alpha = 1.0;
  bool accumulate = false;  // beta = 1 instead of 0
};

enum class BinaryKind { Add, Sub, Mul };

// How b is laid against a viewed as [outer, inner]:
//   Same   b has a's shape;
//   Inner  b is [inner], repeated over outer (a bias over the trailing dims);
//   Outer  b is [outer], repeated over inner (a per-row scale such as the MoD router weight).
enum class Broadcast { Same, Inner, Outer };

struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
  int64_t step = 1;  // 1-based, for bias correction
};
// MoE slot selection (Backend::moe_select).
struct MoeSelectArgs {
  bool token_choice = false;
  int64_t experts = 0;  // E real experts; a no-op expert, if any, is probs' last column
  int64_t noop = 0;     // expert choice: tokens the no-op expert takes first (0: none)
  int64_t k = 0;        // slots per (sequence, expert)
  int64_t top_k = 1;    // token choice: experts each token asks for
};

// Drawing the next token on the device (Backend::sample_tokens). With temperature > 0 the kept
// set is the top_k largest logits (0: all; ties at the k-th value kept), then the smallest set of
// the largest probabilities (over the top-k set) whose mass reaches top_p (ties at the threshold
// kept). The draw: u = philox_uniform(seed, first_stream + row, pos[row]) (core/philox.h) times
// the kept mass, walked over the kept tokens in ascending id order.
struct SampleArgs {
  double temperature = 1.0;  // 0 (or less): greedy, the lowest id among the largest logits
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // 1: no nucleus filter
  uint64_t seed = 1;
  uint64_t first_stream = 0;  // row b draws from stream first_stream + b
};

// What sample_tokens writes for a row whose logits hold a NaN or an infinity, instead of an id;
// decode_advance stores it as the token and stops that sequence (its current token stays a real
// id), so the host finds it with the tokens at the end, with no read per step.
constexpr int64_t kNonFiniteLogitsToken = -2;

// The scalars one AdamW step multiplies by, computed on the host in double (core/ops/optim.h
// adamw_step_constants): {1 - lr * weight_decay, lr / (1 - beta1^step), 1 / sqrt(1 - beta2^step)}.
// Kernels read them from a device tensor, so a captured step replays with the current values.
constexpr int64_t kAdamWConstants = 3;

// One parameter of a multi-tensor AdamW update (Backend::adamw_update_multi): param, grad, m, v
// of one numel and dtype; consts its group's step constants (f64 [kAdamWConstants]); copy
// undefined, or the parameter's weight copy (core/weight_copy.h: same numel, another float
// dtype), written with the updated parameter rounded to its dtype.
struct AdamWSlot {
  Tensor param, grad, m, v, consts, copy;
};
// A multi-tensor update's table on the device: one entry per slot (numel > 0), in slot order.
// Chunks of kMultiTensorChunk elements are numbered across all slots; entry k's chunks are
// [first_chunk, first_chunk + ceil(numel / kMultiTensorChunk)), so one launch covers every
// slot, one block per chunk (apex's multi_tensor_apply, llm.c's multi-tensor AdamW). The
// norm's table (Backend::sum_squares_multi) uses the same rows with only `grad` set.
struct MultiTensorEntry {
  void* param;
  const void* grad;
  void* m;
  void* v;
  void* copy;  // null: none
  const double* consts;
  int64_t numel;
  int64_t first_chunk;
};
constexpr int64_t kMultiTensorChunk = int64_t{1} << 16;

// A recorded sequence of device work (a CUDA graph), replayed with the same memory: every
// tensor it reads or writes must stay alive and in place, and new inputs are copied into the
// tensors it was captured with.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;  // enqueues the work; returns without waiting for it
};

struct MemoryStats {
  size_t in_use_bytes = 0;
  size_t peak_in_use_bytes = 0;
};

// routing_summary's output: sums and extremes of r, the causal decision (logit > 0) against
// membership (member > 0.5) as counts, members by position bucket (position * 8 / T), then
// the counts of r in util::histogram_upper_bounds(min, max, kHistogramBuckets) (one bucket, the
// first, when min == max).
struct RoutingSummary {
  static constexpr int kPositionBuckets = 8, kHistogramBuckets = 30;
  static constexpr int kSum = 0, kSumSquares = 1, kMin = 2, kMax = 3;
  static constexpr int kTruePositive = 4, kFalsePositive = 5, kFalseNegative = 6, kCorrect = 7;
  static constexpr int kMembersByBucket = 8;
  static constexpr int kHistogram = kMembersByBucket + kPositionBuckets;
  static constexpr int kSize = kHistogram + kHistogramBuckets;
  // Throws unless out is f64 [kSize] and r, decision and member share r's shape, dtype and
  // device: the kernels would write past a smaller out.
  static void check(const Tensor& r, const Tensor& decision, const Tensor& member,
                    const Tensor& out);
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;  // e.g. the GEMM kernel in use

  // --- memory (core/cpu/cpu_backend.cpp) ---
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;  // bytes as allocated
  // Bytes handed out and not yet freed (a caching allocator's cached blocks are not in use), and
  // their highest since reset_peak_memory; zeros from a backend that does not count.
  virtual MemoryStats memory_stats() const { return {}; }
  virtual void reset_peak_memory() {}
  virtual void copy(const Tensor& src, Tensor& dst) = 0;     // same dtype and numel
  virtual void convert(const Tensor& src, Tensor& dst) = 0;  // between float dtypes
  virtual void fill(Tensor& dst, double value) = 0;
  // 2-D strided copy on this device, in bytes: `rows` rows of `width` bytes, row i from
  // src.raw_data() + src_offset + i * src_pitch to dst.raw_data() + dst_offset + i * dst_pitch
  // (the permutations of tensor- and expert-parallel exchanges; cudaMemcpy2D on a GPU).
  virtual void copy_rows(const Tensor& src, size_t src_offset, size_t src_pitch, Tensor& dst,
                         size_t dst_offset, size_t dst_pitch, size_t rows, size_t width) = 0;

  // --- matmul family (ops/matmul) ---
  virtual void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) = 0;
  // GEMMs with GELU (gelu_forward's tanh approximation) in the epilogue: a GELU MLP's up
  // projection and the backward through its down projection (core/ops/mlp.h). One matrix
  // (batch 1), alpha 1, no accumulate; pre, out and c share a's dtype.
  // pre = op(A) op(B) and out = gelu(pre). The default runs gemm, then gelu_forward; a CUDA
  // backend writes both from the GEMM (cuBLASLt's GELU_AUX epilogue).
  virtual void gemm_gelu(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& pre,
                         Tensor& out);
  // out = (op(A) op(B)) * gelu'(pre). The default runs gemm into out, then gelu_backward in
  // place (dx over dy); a CUDA backend multiplies in the GEMM (the DGELU epilogue).
  virtual void gemm_dgelu(const GemmArgs& args, const Tensor& a, const Tensor& b,
                          const Tensor& pre, Tensor& out);
  // One score per row against a weight in a wider dtype (core/ops/matmul.h row_scores: MoD's
  // router on bf16 activations with f32 weights). x [N,D] in a float dtype no wider than w's;
  // w [D], r [N] in w's dtype: r[n] = sum_d x[n,d] w[d], summed in w's dtype. The default
  // converts x to w's dtype and runs gemm, as cast then matmul do; a CUDA backend reads x as is.
  virtual void row_scores_forward(const Tensor& x, const Tensor& w, Tensor& r);
  // dx[n,d] = dr[n] w[d] rounded to x's dtype (then added into dx, one more rounding, when
  // accumulate_dx); dw[d] = sum_n dr[n] x[n,d] in w's dtype, added into dw when accumulate_dw.
  // dx or dw undefined: not wanted. dr [N] in w's dtype.
  virtual void row_scores_backward(const Tensor& x, const Tensor& w, const Tensor& dr, Tensor& dx,
                                   bool accumulate_dx, Tensor& dw, bool accumulate_dw);

  // --- elementwise family (ops/elementwise) ---
  // out = a (op) b, b broadcast as described; out has a's shape.
  virtual void binary(BinaryKind kind, Broadcast bcast, int64_t outer, int64_t inner,
                      const Tensor& a, const Tensor& b, Tensor& out) = 0;
  virtual void scale(const Tensor& x, double alpha, Tensor& out) = 0;  // out = alpha * x
  virtual void axpy(double alpha, const Tensor& x, Tensor& y) = 0;     // y += alpha * x

  // --- reduction family (ops/reduce) ---
  virtual void sum_all(const Tensor& x, Tensor& out) = 0;  // out: one element
  // out: one element, the sum of x's squared entries (a gradient norm's share) in one pass.
  virtual void sum_squares(const Tensor& x, Tensor& out) = 0;
  // x viewed as [outer, inner]: sum over outer -> out [inner], or over inner -> out [outer].
  virtual void sum_outer(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) = 0;
  virtual void sum_inner(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) = 0;

  // --- embedding family (ops/embedding) ---
  // ids [N] (i32/i64, validated in range by the caller), table [V,D], out [N,D].
  virtual void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) = 0;
  // dtable [V,D] += scatter of dout [N,D] by ids; repeated ids accumulate.
  virtual void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) = 0;
  // A vocabulary slice [start, start + rows) (tensor parallelism): ids [N] (i32/i64, any
  // value) -> local [N] i64 = id - start where the slice holds id, else 0, and here [N] (float)
  // = 1 there, else 0. On the device, so the ranks' bookkeeping needs no host copy.
  virtual void index_slice(const Tensor& ids, int64_t start, int64_t rows, Tensor& local,
                           Tensor& here) = 0;

  // --- norm family (ops/norm); x,y [N,D]; forward caches per-row stats for backward ---
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                               Tensor& rstd /*[N]*/) = 0;
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                const Tensor& rstd, Tensor& dx, Tensor& dweight) = 0;
  virtual void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 double eps, Tensor& y, Tensor& mean /*[N]*/,
                                 Tensor& rstd /*[N]*/) = 0;
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                  Tensor& dweight, Tensor& dbias) = 0;
  // The residual add fused with the norm (llm.c's fused_residual_forward): s = x + a, rounded
  // to the dtype, and y = norm(s), reading x and a once; x, a, s, y [N,D]. The backward takes
  // dy and ds (the gradient reaching s from its other uses; undefined when none) and writes
  // dx = ds + the norm's dx [N,D], the gradient of both x and a, in one pass.
  virtual void add_rmsnorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                   double eps, Tensor& s, Tensor& y, Tensor& rstd /*[N]*/) = 0;
  virtual void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                    const Tensor& weight, const Tensor& rstd, Tensor& dx,
                                    Tensor& dweight) = 0;
  virtual void add_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                                     const Tensor& bias, double eps, Tensor& s, Tensor& y,
                                     Tensor& mean /*[N]*/, Tensor& rstd /*[N]*/) = 0;
  virtual void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                                      const Tensor& weight, const Tensor& mean,
                                      const Tensor& rstd, Tensor& dx, Tensor& dweight,
                                      Tensor& dbias) = 0;

  // --- activation family (ops/activation); elementwise over any shape ---
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;  // tanh approximation (GPT-2)
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void silu_forward(const Tensor& x, Tensor& y) = 0;
  virtual void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  virtual void sigmoid_forward(const Tensor& x, Tensor& y) = 0;
  virtual void sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;
  // y = silu(gate) * up
  virtual void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) = 0;
  virtual void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy,
                               Tensor& dgate, Tensor& dup) = 0;

  // --- softmax family (ops/softmax); rows [N,V] ---
  virtual void softmax_forward(const Tensor& x, Tensor& y) = 0;
  virtual void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
  // x [N,V] (V > 0), out [N]: out[n] = max + log(sum(exp(x[n] - max))); a row whose max is
  // +-inf gives that max. No backward kernel: dx = softmax_forward(x) * dout (Broadcast::Outer).
  virtual void logsumexp_forward(const Tensor& x, Tensor& out) = 0;
  // losses[n] = logsumexp(logits[n]) - logits[n, target[n]], or 0 where target == ignore_index;
  // lse [N] cached for backward.
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& targets,
                                     int64_t ignore_index, Tensor& losses, Tensor& lse) = 0;
  // dlogits = scale * (exp(logits - lse) - onehot(target)); zero rows where ignored. scale is
  // a 0-d tensor of logits' dtype on their device (the loss's gradient over the target count,
  // which a device computes and never copies to the host).
  // logits may be the columns [vocab_start, vocab_start + V) of a wider vocabulary (the
  // vocabulary-parallel loss): targets are then ids in the whole vocabulary, one outside this
  // slice adds no onehot term, and lse is the whole row's (f32 or f64, never recomputed here).
  virtual void cross_entropy_backward(const Tensor& logits, const Tensor& targets,
                                      const Tensor& lse, int64_t ignore_index,
                                      int64_t vocab_start, const Tensor& scale,
                                      Tensor& dlogits) = 0;
  // Softmax, loss and dlogits in one pass over each row (the fused classifier,
  // core/ops/loss.h linear_cross_entropy): losses[n] as cross_entropy_forward computes them;
  // then, when scale is defined, logits[n] is overwritten in place by
  // scale * (softmax(logits[n]) - onehot(target[n])), a zero row where ignored. losses [N] and
  // scale [] are in stats_dtype(logits' dtype) (f32 for bf16 logits); an undefined scale leaves
  // logits as they were (the loss alone, for evaluation).
  virtual void cross_entropy_with_dlogits(Tensor& logits, const Tensor& targets,
                                          int64_t ignore_index, const Tensor& scale,
                                          Tensor& losses) = 0;

  // --- rope family (ops/rope) ---
  // x,y [B,T,H,Dh], pos [B,T] (i32/i64). Rotates pairs (i, i + Dh/2) by angle
  // pos * theta^(-2i/Dh); inverse rotates by the negative angle (the backward).
  virtual void rope(const Tensor& x, const Tensor& pos, double theta, bool inverse,
                    Tensor& y) = 0;

  // --- attention family (ops/attention); flash-style tiling, no T x S buffer ---
  // q [B,T,H,Dh], k,v [B,S,H,Dh], q_pos [B,T], k_pos [B,S] (each row strictly increasing).
  // Query i attends to key j iff k_pos[j] <= q_pos[i]; scale 1/sqrt(Dh).
  // out [B,T,H,Dh]; lse [B,H,T] (log-sum-exp of scaled scores) cached for backward, in q's
  // dtype, except f32 for bf16 q. A query that sees no key (S = 0 or k_pos[0] > q_pos[i]) gets
  // the empty sum: out 0 and lse -inf; backward gives it dq 0 and takes nothing from it into
  // dk, dv (the gradient of a constant).
  virtual void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Tensor& q_pos, const Tensor& k_pos, Tensor& out,
                                 Tensor& lse) = 0;
  virtual void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& q_pos, const Tensor& k_pos, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                  Tensor& dv) = 0;

  // --- routing family (ops/routing): the MoD gather/scatter and top-k ---
  // x [B,T,D], idx [B,C] (i32/i64, validated by the caller), out [B,C,D]: out[b,c] = x[b,idx[b,c]].
  // x may also be an index tensor (i32/i64): the model gathers routed tokens' positions so.
  virtual void gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) = 0;
  // out [B,T,D] += scatter of src [B,C,D]: out[b, idx[b,c]] += src[b,c] (repeats accumulate).
  virtual void scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) = 0;
  // A routed block's gated residual update (ops/routing scatter_gated_rows): out[b, idx[b,c]] +=
  // gate[b,c] * src[b,c], the product rounded to out's dtype before the add; gate [B,C,1]. The
  // default multiplies into a temporary, then scatter_add_rows; a CUDA backend does both in one
  // pass over the C rows.
  virtual void scatter_gated_rows(const Tensor& idx, const Tensor& src, const Tensor& gate,
                                  Tensor& out);
  // Its backward from dout [B,T,D]: dsrc[b,c] = gate[b,c] * dout[b, idx[b,c]] and dgate[b,c] =
  // sum_d src[b,c,d] * dout[b, idx[b,c], d] (either undefined: not wanted). The default gathers
  // the rows, then multiplies and sums as mul's backward does; a CUDA backend reads each row once.
  virtual void scatter_gated_rows_backward(const Tensor& dout, const Tensor& idx,
                                           const Tensor& src, const Tensor& gate, Tensor& dsrc,
                                           Tensor& dgate);
  // scores [B,T] -> idx [B,k] (i64): the k largest per row, sorted ascending by position;
  // among equal scores the lower position wins.
  virtual void topk_rows(const Tensor& scores, int64_t k, Tensor& idx) = 0;
  // A routed block's statistics for metrics (model/routing_stats.h), reduced where the tensors
  // are so that only out crosses to the host: r (router scores), decision (causal logits) and
  // member (top-C membership, 0 or 1) [R,T] in one float dtype -> out f64 [RoutingSummary::kSize]
  // laid out as RoutingSummary says. R * T > 0.
  virtual void routing_summary(const Tensor& r, const Tensor& decision, const Tensor& member,
                               Tensor& out) = 0;
  // MoE slot selection per sequence, on the device (the semantics of model/moe_routing.h).
  // probs [B,T,E'] (float) -> expert-major slots, (e, b, j) at (e * B + b) * K + j:
  //   rows [E*B*K] i64       b * T + the slot's token (b * T for an empty slot)
  //   gate_rows [E*B*K] i64  rows * E' + e: the slot's gate in probs viewed [B*T*E']
  //   valid [E*B*K] (float)  1, or 0 for an empty token-choice slot
  //   share [B,E] (float)    token choice: each expert's share of the sequence's first
  //                          choices (the balance loss); 0 under expert choice
  //   counts [B,2] f64       per sequence: tokens no real expert took, choices dropped
  virtual void moe_select(const Tensor& probs, const MoeSelectArgs& args, Tensor& rows,
                          Tensor& gate_rows, Tensor& valid, Tensor& share, Tensor& counts) = 0;

  // --- decode family (ops/decode): batched one-token decoding with static KV caches ---
  // B sequences, each at its own position; caches [B,S,W] (W = H*Dh) hold each sequence's admitted
  // tokens in slots [0, len[b]). Flags and lengths are i64 [B]; nothing here reads the host.
  // admit[b] = active[b] != 0 && decision[b] > 0; decision [B] (float), admit [B] i64.
  virtual void decode_admit(const Tensor& decision, const Tensor& active, Tensor& admit) = 0;
  // Row i of k, v [N,W] belongs to sequence b = rows[i] (b = i, N = B, when rows is
  // undefined; rows distinct). Where admit[i] != 0 (every row when admit is undefined):
  // k_cache[b, len[b]] = k[i], v_cache[b, len[b]] = v[i] and len[b] += 1; nothing is written
  // for other rows, nor where len[b] == S. k_cache, v_cache [B,S,W], one dtype with k and v.
  virtual void kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit,
                               const Tensor& rows, Tensor& len, Tensor& k_cache,
                               Tensor& v_cache) = 0;
  // q [N,H,Dh], row i of sequence b = rows[i] (or i), attends to slots [0, len[b]) of k_cache,
  // v_cache [B,S,H,Dh]: out [N,H,Dh] = softmax(q k^T / sqrt(Dh)) v; 0 where len[b] == 0.
  virtual void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor& len, const Tensor& rows, Tensor& out) = 0;
  // out[b] = admit[b] != 0 ? x[b] + u[b] : x[b]; x, u, out [B,N], one float dtype.
  virtual void masked_add(const Tensor& x, const Tensor& u, const Tensor& admit, Tensor& out) = 0;
  // logits [B,V] (float), pos [B] i64 -> next [B] i64, drawn as SampleArgs says.
  virtual void sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args,
                             Tensor& next) = 0;
  // One step of every sequence's bookkeeping, all i64: with p = pos[b] + 1 and p < L,
  // tokens[b,p] keeps the prompt's token where p < prompt_len[b], else takes next[b]; cur[b] =
  // tokens[b,p]; active[b] stays 1 while p < stop[b] and no generated token is eot (eot < 0:
  // none); pos[b] = p. tokens [B,L]; next, prompt_len, stop, pos, cur, active [B].
  virtual void decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop,
                              int64_t eot, Tensor& tokens, Tensor& pos, Tensor& cur,
                              Tensor& active) = 0;

  // --- loss family (ops/loss) ---
  // losses = max(x,0) - x*t + log(1 + exp(-|x|)), elementwise; targets same shape, float.
  virtual void bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                                       Tensor& losses) = 0;
  // dlogits = grad_scale * (sigmoid(x) - t)
  virtual void bce_with_logits_backward(const Tensor& logits, const Tensor& targets,
                                        double grad_scale, Tensor& dlogits) = 0;
  // targets [N] (i32/i64) -> out [1] (float): 1 / (number of targets != ignore_index), 0 when
  // every target is ignored. The mean's divisor stays on the device: no host round trip.
  virtual void inverse_target_count(const Tensor& targets, int64_t ignore_index,
                                    Tensor& out) = 0;

  // --- optimizer family (ops/optim) ---
  // In place: m,v moments (same shape as param); decoupled weight decay (AdamW). args gives
  // beta1, beta2 and eps; lr, weight decay and step enter only through consts (f64
  // [kAdamWConstants] on param's device). grad_scale, one element in grad's dtype on its device
  // (the global-norm clip factor) or undefined (1), multiplies every gradient entry as it is
  // read, so clipping needs no pass of its own over the gradients.
  virtual void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                            const AdamWArgs& args, const Tensor& consts,
                            const Tensor& grad_scale) = 0;
  // Global-norm clipping on the device: sq [1] f64, the sum of squared gradient entries ->
  // norm [1] f64 = sqrt(sq) and factor [1] (the gradients' dtype) = max_norm / (norm + 1e-6)
  // when max_norm > 0 and norm > max_norm, else 1.
  // adamw_update over every slot in one pass. CUDA: one launch over `table`, a device tensor of
  // at least entries.size() MultiTensorEntry rows (entries: the slots' rows, built on the host
  // by the op), which the backend first rewrites from `entries` when `rewrite` (kernels taking
  // the rows as parameters: capturable, so a captured step whose gradients live at new
  // addresses rewrites it at every replay). The CPU reads the slots and ignores the table.
  // Every slot shares the dtype of slots[0].param, every copy that of the first copy. Each
  // element sees adamw_update's arithmetic exactly (core/adamw_element.h).
  virtual void adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                                  const Tensor& grad_scale,
                                  const std::vector<MultiTensorEntry>& entries, Tensor& table,
                                  bool rewrite) = 0;
  virtual void clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) = 0;
  // The global norm's square in one pass: out [1] f64 = the sum of every squared entry of every
  // tensor of xs (one float dtype, any shapes and numel, views included), accumulated in double.
  // CUDA: one launch over `table`, rows as adamw_update_multi's (entries: one per tensor with
  // numel > 0, its address in `grad`, the other pointers null; rewritten first when `rewrite`),
  // one block per chunk writing its f64 partial, then one pass adding the partials in a fixed
  // order: no atomics, the same bits on every run. The CPU sums tensor after tensor in order
  // (each in double, as sum_squares) and ignores the table.
  virtual void sum_squares_multi(const std::vector<Tensor>& xs,
                                 const std::vector<MultiTensorEntry>& entries, Tensor& table,
                                 bool rewrite, Tensor& out) = 0;

  // --- capture (CUDA graphs) ---
  // Between begin_capture and end_capture the kernels this backend is given are recorded, not
  // run; a host read of a device tensor in between is an error. The CPU has no graphs: both
  // throw there.
  virtual void begin_capture();
  virtual std::unique_ptr<CapturedWork> end_capture();
  // Runs body's work only when some entry of flags (i64 [N] on this device) is nonzero, without
  // reading flags on the host: inside a capture the body becomes a conditional (IF) node of the
  // graph, its condition set by a kernel from flags (CUDA 12.3+). Elsewhere body() simply runs,
  // so the body must be right whether or not a flag is set (decoding's masked updates are): a
  // skipped body is the same as one that ran with every flag zero.
  virtual void run_if_any(const Tensor& flags, const std::function<void()>& body);
};

// The backend for a device. Throws a clear error for CUDA in a build without CUDA.
Backend& backend(Device device);
// Tests only: serves Device::CUDA with `b` (nullptr restores the real one). With the CPU
// kernels behind a backend that reports Device::CUDA, the whole device path (parameters,
// batches, index tensors, checkpoints) runs on a machine without a GPU, and any host read of
// a device tensor (Tensor::at) throws.
void set_cuda_backend_for_testing(Backend* b);
inline Backend& backend_of(const Tensor& t) { return backend(t.device()); }

}  // namespace mod
