// CUDA kernels of batched decoding (Backend's decode family), the rules of
// core/cpu/ops/decode.cpp with no host synchronisation, so one decode step can be captured as a
// graph. Shapes: B sequences, S cache slots, H heads, Dh head dim, W = H*Dh, V vocabulary.
// - decode_attention: one block per (sequence, head), a warp per key: scores of the len[b]
//   cached keys in shared memory, softmax, then each warp sums its keys' values and the warps'
//   partial rows are added in a fixed order.
// - sample_tokens: one block per row. Greedy is one argmax. Sampling finds the top-k and top-p
//   thresholds by a bitwise search over order-preserving keys of the logits (32 passes over the
//   row each; a pass counts, or sums exp, at or above a candidate key), then draws by a chunked
//   prefix sum. Every reduction has a fixed order, so a seeded run repeats exactly.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/philox.h"

namespace mod::cuda {

namespace {

template <typename T>
__global__ void decode_admit_kernel(const T* decision, const int64_t* active, int64_t n,
                                    int64_t* admit) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n;
       b += int64_t(gridDim.x) * blockDim.x)
    admit[b] = active[b] != 0 && load(decision + b) > Acc<T>(0) ? 1 : 0;
}

// Block r copies row r of k and v into slot len[b] of sequence b = rows[r] (or r), then
// advances len[b]. Rows name distinct sequences, so no two blocks touch one length.
template <typename T>
__global__ void kv_cache_append_kernel(const T* k, const T* v, const int64_t* admit,
                                       const int64_t* rows, int64_t* len, int64_t s, int64_t w,
                                       T* k_cache, T* v_cache) {
  const int64_t r = blockIdx.x, b = rows ? rows[r] : r;
  if (admit && admit[r] == 0) return;
  const int64_t n = len[b];
  if (n >= s) return;
  for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
    k_cache[(b * s + n) * w + i] = k[r * w + i];
    v_cache[(b * s + n) * w + i] = v[r * w + i];
  }
  __syncthreads();  // every thread has read len[b]
  if (threadIdx.x == 0) len[b] = n + 1;
}

constexpr int kAttnWarps = 4;
constexpr int kMaxHeadDim = 256;  // 8 values a lane

template <typename A>
__device__ A block_max(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? scratch[lane] : scratch[0];
  return warp_max(v);
}

// Block (row r, head h): q [N,H,Dh], caches [B,S,H,Dh] of sequence b = rows[r] (or r) -> out
// [N,H,Dh]. Shared: S scores, then kAttnWarps partial rows of Dh, then 32 reduction slots.
template <typename T>
__global__ void decode_attention_kernel(const T* q, const T* k_cache, const T* v_cache,
                                        const int64_t* len, const int64_t* rows, int64_t s,
                                        int64_t h_n, int64_t dh, T* out) {
  using A = Acc<T>;
  extern __shared__ unsigned char smem[];
  A* score = reinterpret_cast<A*>(smem);
  A* part = score + s;
  A* scratch = part + kAttnWarps * dh;
  const int64_t r = blockIdx.x / h_n, h = blockIdx.x % h_n, ld = h_n * dh;
  const int64_t b = rows ? rows[r] : r;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = min(len[b], s);
  T* o = out + (r * h_n + h) * dh;
  if (n == 0) {
    for (int64_t d = threadIdx.x; d < dh; d += blockDim.x) o[d] = from_acc<T>(A(0));
    return;
  }
  A qr[kMaxHeadDim / 32];
  const T* qp = q + (r * h_n + h) * dh;
  for (int i = 0; i < kMaxHeadDim / 32; ++i) {
    const int64_t d = lane + 32 * i;
    qr[i] = d < dh ? load(qp + d) : A(0);
  }
  const A scale = A(1) / acc_sqrt(A(dh));
  for (int64_t j = warp; j < n; j += kAttnWarps) {
    const T* kr = k_cache + (b * s + j) * ld + h * dh;
    A dot = 0;
    for (int i = 0; i < kMaxHeadDim / 32; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dh) dot += qr[i] * load(kr + d);
    }
    dot = warp_sum(dot);
    if (lane == 0) score[j] = dot * scale;
  }
  __syncthreads();
  A m = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) m = max(m, score[j]);
  m = block_max(m, scratch);
  A sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += (score[j] = acc_exp(score[j] - m));
  sum = block_sum(sum, scratch);  // its syncs also publish the exponentials
  A acc[kMaxHeadDim / 32] = {};
  for (int64_t j = warp; j < n; j += kAttnWarps) {
    const T* vr = v_cache + (b * s + j) * ld + h * dh;
    const A p = score[j];
    for (int i = 0; i < kMaxHeadDim / 32; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < dh) acc[i] += p * load(vr + d);
    }
  }
  for (int i = 0; i < kMaxHeadDim / 32; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < dh) part[warp * dh + d] = acc[i];
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < dh; d += blockDim.x) {
    A total = 0;
    for (int w = 0; w < kAttnWarps; ++w) total += part[w * dh + d];
    o[d] = from_acc<T>(total / sum);
  }
}

template <typename T>
__global__ void masked_add_kernel(const T* x, const T* u, const int64_t* admit, int64_t total,
                                  int64_t n, T* out) {
  for (GridRowCol g(n); g.i < total; g.next())
    out[g.i] = admit[g.row] != 0 ? from_acc<T>(load(x + g.i) + load(u + g.i)) : x[g.i];
}

// Order-preserving unsigned key of a float: a < b iff key(a) < key(b) (no NaN in logits).
__device__ __forceinline__ uint32_t order_key(float x) {
  const uint32_t bits = __float_as_uint(x);
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

constexpr int kSampleThreads = 256;

// Block reductions over a row, every thread getting the result (shared `scratch`: 32 slots).
__device__ int64_t block_count(int64_t v, int64_t* scratch) {
  return block_sum<int64_t>(v, scratch);
}

// Row `blockIdx.x` of logits [B,V] -> next[row]. Sums run in double, as the CPU's do. Each
// weight exp((l - max) / temperature) is computed once into scratch [B,V] (double, as the CPU
// computes it): the top-p search passes over the row 32 times and would otherwise evaluate
// 32 double exps per token id.
template <typename T>
__global__ void sample_tokens_kernel(const T* logits, const int64_t* pos, int64_t v,
                                     SampleArgs a, double* scratch, int64_t* next) {
  __shared__ double dscratch[32];
  __shared__ int64_t iscratch[32];
  __shared__ float fscratch[32];
  __shared__ double chunk[kSampleThreads];
  __shared__ int chosen;
  const int64_t b = blockIdx.x;
  const T* l = logits + b * v;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  bool non_finite = false;
  for (int64_t i = t; i < v; i += blockDim.x)
    non_finite = non_finite || !isfinite(static_cast<float>(load(l + i)));
  if (__syncthreads_or(non_finite)) {
    if (t == 0) next[b] = kNonFiniteLogitsToken;
    return;
  }
  if (a.temperature <= 0) {  // argmax, the lowest id among equals
    float best = -INFINITY;
    int64_t at = v;
    for (int64_t i = t; i < v; i += blockDim.x) {
      const float x = static_cast<float>(load(l + i));
      if (x > best || (x == best && i < at)) best = x, at = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int64_t oa = __shfl_xor_sync(0xffffffffu, at, o);
      if (ob > best || (ob == best && oa < at)) best = ob, at = oa;
    }
    if (lane == 0) fscratch[warp] = best, iscratch[warp] = at;
    __syncthreads();
    if (t == 0) {
      for (int w = 1; w < (int(blockDim.x) + 31) / 32; ++w)
        if (fscratch[w] > best || (fscratch[w] == best && iscratch[w] < at))
          best = fscratch[w], at = iscratch[w];
      next[b] = at < v ? at : 0;
    }
    return;
  }
  float m = -INFINITY;
  for (int64_t i = t; i < v; i += blockDim.x) m = fmaxf(m, static_cast<float>(load(l + i)));
  m = block_max(m, fscratch);
  double* w = scratch + b * v;
  for (int64_t i = t; i < v; i += blockDim.x)
    w[i] = exp((static_cast<double>(load(l + i)) - m) / a.temperature);
  __syncthreads();  // the chunk pass below reads weights other threads wrote
  auto weight = [&](int64_t i) { return w[i]; };
  // The k-th largest key: the largest key with at least top_k logits at or above it.
  uint32_t kth = 0;
  if (a.top_k > 0 && a.top_k < v)
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = kth | (1u << bit);
      int64_t c = 0;
      for (int64_t i = t; i < v; i += blockDim.x)
        c += order_key(static_cast<float>(load(l + i))) >= cand;
      if (block_count(c, iscratch) >= a.top_k) kth = cand;
    }
  double z = 0;
  for (int64_t i = t; i < v; i += blockDim.x)
    if (order_key(static_cast<float>(load(l + i))) >= kth) z += weight(i);
  z = block_sum(z, dscratch);
  // The top-p key: the largest key whose kept tokens at or above it hold top_p of the mass.
  uint32_t thr = kth;
  if (a.top_p < 1) {
    uint32_t p_key = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = p_key | (1u << bit);
      double mass = 0;
      for (int64_t i = t; i < v; i += blockDim.x) {
        const uint32_t key = order_key(static_cast<float>(load(l + i)));
        if (key >= cand && key >= kth) mass += weight(i);
      }
      if (block_sum(mass, dscratch) >= a.top_p * z) p_key = cand;
    }
    thr = max(thr, p_key);
  }
  // Chunk t of the row: ids [lo, hi), summed in id order; thread 0 scans the chunks.
  const int64_t per = (v + blockDim.x - 1) / blockDim.x, lo = min(v, t * per),
                hi = min(v, lo + per);
  double c = 0;
  for (int64_t i = lo; i < hi; ++i)
    if (order_key(static_cast<float>(load(l + i))) >= thr) c += weight(i);
  chunk[t] = c;
  __syncthreads();
  __shared__ double target_left;
  if (t == 0) {
    double total = 0;
    for (int i = 0; i < int(blockDim.x); ++i) total += chunk[i];
    double target = philox_uniform(a.seed, a.first_stream + static_cast<uint64_t>(b),
                                   static_cast<uint64_t>(pos[b])) *
                    total;
    int last = 0;
    chosen = -1;
    for (int i = 0; i < int(blockDim.x); ++i) {
      if (chunk[i] == 0) continue;
      last = i;
      if (target < chunk[i]) {
        chosen = i;
        break;
      }
      target -= chunk[i];
    }
    if (chosen < 0) chosen = last, target = INFINITY;  // rounding: the last kept token
    target_left = target;
  }
  __syncthreads();
  if (t != chosen) return;
  double target = target_left;
  int64_t pick = lo;
  for (int64_t i = lo; i < hi; ++i) {
    if (order_key(static_cast<float>(load(l + i))) < thr) continue;
    pick = i;
    target -= weight(i);
    if (target < 0) break;
  }
  next[b] = pick;
}

__global__ void decode_advance_kernel(const int64_t* next, const int64_t* prompt_len,
                                      const int64_t* stop, int64_t eot, int64_t b_n, int64_t l,
                                      int64_t* tokens, int64_t* pos, int64_t* cur,
                                      int64_t* active) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < b_n;
       b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = pos[b] + 1;
    if (p >= l) {
      active[b] = 0;
      continue;
    }
    const bool generated = p >= prompt_len[b];
    if (generated && next[b] == kNonFiniteLogitsToken) {  // kept as the marker; cur stays an id
      tokens[b * l + p] = next[b];
      active[b] = 0;
      pos[b] = p;
      continue;
    }
    if (generated) tokens[b * l + p] = next[b];
    cur[b] = tokens[b * l + p];
    if (p >= stop[b] || (generated && eot >= 0 && next[b] == eot)) active[b] = 0;
    pos[b] = p;
  }
}

}  // namespace

void CudaBackend::decode_admit(const Tensor& decision, const Tensor& active, Tensor& admit) {
  const int64_t n = decision.numel();
  dispatch_float(decision.dtype(), "decode_admit", [&](auto z) {
    using T = decltype(z);
    decode_admit_kernel<<<grid_for(n), kThreads, 0, compute_stream()>>>(
        decision.data<T>(), active.data<int64_t>(), n, admit.data<int64_t>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit,
                                  const Tensor& rows, Tensor& len, Tensor& k_cache,
                                  Tensor& v_cache) {
  const int64_t b_n = k_cache.size(0), s = k_cache.size(1), w = k_cache.numel() / (b_n * s);
  const int64_t n_rows = k.size(0);
  if (n_rows == 0) return;
  dispatch_float(k_cache.dtype(), "kv_cache_append", [&](auto z) {
    using T = decltype(z);
    kv_cache_append_kernel<<<static_cast<unsigned>(n_rows), row_threads(w, 1024), 0,
                             compute_stream()>>>(
        k.data<T>(), v.data<T>(), admit.defined() ? admit.data<int64_t>() : nullptr,
        rows.defined() ? rows.data<int64_t>() : nullptr, len.data<int64_t>(), s, w,
        k_cache.data<T>(), v_cache.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                   const Tensor& len, const Tensor& rows, Tensor& out) {
  const int64_t n_rows = q.size(0), h_n = q.size(1), dh = q.size(2), s = k_cache.size(1);
  if (n_rows == 0) return;
  if (dh > kMaxHeadDim)
    throw std::invalid_argument("decode_attention: head dim " + std::to_string(dh) +
                                " above the kernel's " + std::to_string(kMaxHeadDim));
  dispatch_float(q.dtype(), "decode_attention", [&](auto z) {
    using T = decltype(z);
    const size_t smem = (s + kAttnWarps * dh + 32) * sizeof(Acc<T>);
    if (smem > 48 * 1024)
      throw std::invalid_argument("decode_attention: a cache of " + std::to_string(s) +
                                  " slots needs " + std::to_string(smem) +
                                  " bytes of shared memory, above 48 KiB");
    decode_attention_kernel<<<static_cast<unsigned>(n_rows * h_n), kAttnWarps * 32, smem,
                              compute_stream()>>>(
        q.data<T>(), k_cache.data<T>(), v_cache.data<T>(), len.data<int64_t>(),
        rows.defined() ? rows.data<int64_t>() : nullptr, s, h_n, dh, out.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::masked_add(const Tensor& x, const Tensor& u, const Tensor& admit, Tensor& out) {
  const int64_t total = x.numel(), n = total / x.size(0);
  dispatch_float(x.dtype(), "masked_add", [&](auto z) {
    using T = decltype(z);
    masked_add_kernel<<<grid_for(total), kThreads, 0, compute_stream()>>>(
        x.data<T>(), u.data<T>(), admit.data<int64_t>(), total, n, out.data<T>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args,
                                Tensor& next) {
  const int64_t b_n = logits.size(0), v = logits.size(1);
  dispatch_float(logits.dtype(), "sample_tokens", [&](auto z) {
    using T = decltype(z);
    Tensor scratch = Tensor::empty({args.temperature > 0 ? b_n * v : 0}, DType::F64,
                                   Device::CUDA);
    sample_tokens_kernel<<<static_cast<unsigned>(b_n), kSampleThreads, 0, compute_stream()>>>(
        logits.data<T>(), pos.data<int64_t>(), v, args, scratch.data<double>(),
        next.data<int64_t>());
    MOD_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop,
                                 int64_t eot, Tensor& tokens, Tensor& pos, Tensor& cur,
                                 Tensor& active) {
  const int64_t b_n = tokens.size(0), l = tokens.size(1);
  decode_advance_kernel<<<grid_for(b_n), kThreads, 0, compute_stream()>>>(
      next.data<int64_t>(), prompt_len.data<int64_t>(), stop.data<int64_t>(), eot, b_n, l,
      tokens.data<int64_t>(), pos.data<int64_t>(), cur.data<int64_t>(), active.data<int64_t>());
  MOD_CUDA_CHECK_LAUNCH();
}

}  // namespace mod::cuda
