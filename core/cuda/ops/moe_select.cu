// CUDA MoE slot selection (Backend::moe_select), the rules of core/cpu/ops/moe_select.cpp with
// no host synchronisation. Shapes: B sequences, T tokens, E real experts, E' probs columns, K
// slots per (sequence, expert).
// - Expert choice: rank_select ranks tokens under (score desc, position asc) with one block per
//   (sequence, column), the column's T scores in shared memory and one thread per token doing T
//   compares (T^2 per block: 4M for T = 2048). The no-op column goes first and marks its tokens;
//   each real expert then ranks only the others, keeps rank < K, and a token's slot is the
//   count of kept tokens before it (ascending positions).
// - Token choice: one thread per token picks its top_k experts; one thread per (expert,
//   sequence) then walks the choices in (choice, position) order, as the CPU does, filling K
//   slots and counting what it drops (T * top_k steps).
// - A last kernel per sequence turns the flags into the unrouted count and the shares.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"

namespace mod::cuda {

namespace {

constexpr int kSelectThreads = 256;

struct SlotOut {
  int64_t* rows;
  int64_t* gate_rows;
  int64_t b, t, e_all, k;
  __device__ void put(int64_t e, int64_t r, int64_t j, int64_t token) const {
    const int64_t slot = (e * b + r) * k + j, row = r * t + token;
    rows[slot] = row;
    gate_rows[slot] = row * e_all + e;
  }
};

// Block (column c, sequence r) with c = blockIdx.x % columns + first: ranks the eligible tokens
// (excluded[r*T + t] == 0) by probs[r, t, c]; the `keep` best are marked in `mark` and, in the
// expert pass (valid given), written to the column's slots in position order (valid = 1).
template <typename T>
__global__ void rank_select(const T* probs, SlotOut out, int64_t first, int64_t columns,
                            int64_t keep, const int32_t* excluded, int32_t* mark, T* valid) {
  extern __shared__ unsigned char smem[];
  using A = Acc<T>;
  const int64_t t = out.t, c = first + blockIdx.x % columns, r = blockIdx.x / columns;
  A* score = reinterpret_cast<A*>(smem);
  unsigned char* kept = smem + t * sizeof(A);
  for (int64_t i = threadIdx.x; i < t; i += blockDim.x) {
    score[i] = load(probs + (r * t + i) * out.e_all + c);
    kept[i] = 0;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < t; i += blockDim.x) {
    if (excluded && excluded[r * t + i]) continue;
    const A s = score[i];
    int64_t rank = 0;
    for (int64_t u = 0; u < t && rank < keep; ++u) {
      if (excluded && excluded[r * t + u]) continue;
      rank += score[u] > s || (score[u] == s && u < i);
    }
    kept[i] = rank < keep;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < t; i += blockDim.x) {
    if (!kept[i]) continue;
    mark[r * t + i] = 1;  // several experts may mark one token: the same value
    if (!valid) continue;
    int64_t j = 0;
    for (int64_t u = 0; u < i; ++u) j += kept[u];
    out.put(c, r, j, i);
    valid[(c * out.b + r) * out.k + j] = from_acc<T>(A(1));
  }
}

// One thread per token of sequence blockIdx.y: its top_k experts (probability desc, expert
// asc) into choice[(r*T + t) * top + c], and its first choice counted in first[r*E + e].
template <typename T>
__global__ void token_choices(const T* probs, int64_t t, int64_t e, int64_t top, int32_t* choice,
                              int32_t* first) {
  const int64_t r = blockIdx.y;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < t;
       i += int64_t(gridDim.x) * blockDim.x) {
    const T* p = probs + (r * t + i) * e;
    int32_t best[2] = {-1, -1};
    for (int64_t c = 0; c < top; ++c) {
      int32_t pick = -1;
      for (int32_t x = 0; x < e; ++x) {
        if (x == best[0]) continue;
        if (pick < 0 || load(p + x) > load(p + pick)) pick = x;  // ties keep the lower expert
      }
      best[c] = pick;
      choice[(r * t + i) * top + c] = pick;
    }
    atomicAdd(first + r * e + best[0], 1);
  }
}

// One thread per (expert, sequence): slots in (choice, position) order; `routed` marks the
// tokens placed, `dropped` counts the choices that found the expert full.
template <typename T>
__global__ void token_place(SlotOut out, int64_t experts, int64_t top, const int32_t* choice,
                            int32_t* routed, int32_t* dropped, T* valid) {
  const int64_t n = experts * out.b;
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < n;
       w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = w / out.b, r = w % out.b;
    int64_t used = 0, lost = 0;
    for (int64_t c = 0; c < top; ++c)
      for (int64_t i = 0; i < out.t; ++i) {
        if (choice[(r * out.t + i) * top + c] != e) continue;
        if (used == out.k) {
          ++lost;
          continue;
        }
        valid[(e * out.b + r) * out.k + used] = from_acc<T>(Acc<T>(1));
        out.put(e, r, used++, i);
        routed[r * out.t + i] = 1;
      }
    for (int64_t j = used; j < out.k; ++j) {  // empty slots: token 0, gate 0
      out.put(e, r, j, 0);
      valid[(e * out.b + r) * out.k + j] = from_acc<T>(Acc<T>(0));
    }
    if (lost) atomicAdd(dropped + r, static_cast<int32_t>(lost));
  }
}

// Block per sequence: counts[r] = {tokens not in `taken`, dropped[r]}, share[r, e] = first / T.
template <typename S>
__global__ void finish_counts(const int32_t* taken, const int32_t* dropped, const int32_t* first,
                              int64_t t, int64_t e, double* counts, S* share) {
  __shared__ double scratch[32];
  const int64_t r = blockIdx.x;
  double unrouted = 0;
  for (int64_t i = threadIdx.x; i < t; i += blockDim.x) unrouted += taken[r * t + i] ? 0.0 : 1.0;
  unrouted = block_sum(unrouted, scratch);
  if (threadIdx.x == 0) {
    counts[r * 2] = unrouted;
    counts[r * 2 + 1] = dropped ? dropped[r] : 0.0;
  }
  for (int64_t x = threadIdx.x; x < e; x += blockDim.x)
    share[r * e + x] = first ? from_acc<S>(static_cast<Acc<S>>(
                                   static_cast<double>(first[r * e + x]) / static_cast<double>(t)))
                             : from_acc<S>(Acc<S>(0));
}

Tensor zeros_i32(int64_t n) {
  Tensor z = Tensor::empty({n < 1 ? 1 : n}, DType::I32, Device::CUDA);
  MOD_CUDA_CHECK(cudaMemsetAsync(z.raw_data(), 0, z.nbytes(), compute_stream()));
  return z;
}
}  // namespace

void CudaBackend::moe_select(const Tensor& probs, const MoeSelectArgs& a, Tensor& rows,
                             Tensor& gate_rows, Tensor& valid, Tensor& share, Tensor& counts) {
  const int64_t b = probs.size(0), t = probs.size(1), e_all = probs.size(2);
  if (b == 0 || t == 0) return;
  const SlotOut out{rows.data<int64_t>(), gate_rows.data<int64_t>(), b, t, e_all, a.k};
  Tensor taken = zeros_i32(b * t), dropped, first, choice;
  dispatch_float(probs.dtype(), "moe_select", [&](auto z) {
    using T = decltype(z);
    const T* p = probs.data<T>();
    if (!a.token_choice) {
      const size_t smem = static_cast<size_t>(t) * (sizeof(Acc<T>) + 1);
      if (smem > 48 * 1024)
        throw std::invalid_argument("moe_select: " + std::to_string(t) +
                                    " tokens per sequence exceed the kernel's shared memory");
      Tensor noop;
      if (a.noop > 0) {
        noop = zeros_i32(b * t);
        rank_select<T><<<static_cast<unsigned>(b), kSelectThreads, smem, compute_stream()>>>(
            p, out, a.experts, 1, a.noop, nullptr, noop.data<int32_t>(), nullptr);
        MOD_CUDA_CHECK_LAUNCH();
      }
      if (a.k > 0) {  // every kept (token, expert) marks its token in `taken`
        rank_select<T>
            <<<static_cast<unsigned>(b * a.experts), kSelectThreads, smem, compute_stream()>>>(
                p, out, 0, a.experts, a.k, noop.defined() ? noop.data<int32_t>() : nullptr,
                taken.data<int32_t>(), valid.data<T>());
        MOD_CUDA_CHECK_LAUNCH();
      }
    } else {
      choice = zeros_i32(b * t * a.top_k);
      first = zeros_i32(b * a.experts);
      dropped = zeros_i32(b);
      token_choices<T>
          <<<dim3(grid_for(t), static_cast<unsigned>(b)), kThreads, 0, compute_stream()>>>(
              p, t, a.experts, a.top_k, choice.data<int32_t>(), first.data<int32_t>());
      MOD_CUDA_CHECK_LAUNCH();
      token_place<T><<<grid_for(a.experts * b, 64), 64, 0, compute_stream()>>>(
          out, a.experts, a.top_k, choice.data<int32_t>(), taken.data<int32_t>(),
          dropped.data<int32_t>(), valid.data<T>());
      MOD_CUDA_CHECK_LAUNCH();
    }
    dispatch_stats<T>(share.dtype(), "moe_select", [&](auto zs) {
      using S = decltype(zs);
      finish_counts<S><<<static_cast<unsigned>(b), kSelectThreads, 0, compute_stream()>>>(
          taken.data<int32_t>(), dropped.defined() ? dropped.data<int32_t>() : nullptr,
          first.defined() ? first.data<int32_t>() : nullptr, t, a.experts, counts.data<double>(),
          share.data<S>());
      MOD_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mod::cuda
