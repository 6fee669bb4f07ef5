// CUDA causal attention, FlashAttention-2 style: the math of core/cpu/ops/attention.cpp in
// Acc<T>. Scores exist only as one 32-wide tile per warp, in registers, so no T x S buffer ever
// reaches global memory. Forward caches lse [B,H,T]; backward recomputes P = exp(s - lse).
//
// Work split (every kernel: 4 warps; one block per (b, h, tile of rows); a warp owns kRows rows):
// - attention_forward_flash: rows are queries. The block walks 32-key tiles staged in shared
//   memory and stops at the first tile whose first key is later than its last query (both
//   position rows increase, so every later tile is masked too). Scores with lane = key; online
//   softmax (running max, sum) per row; P V with lane = head dim, P broadcast by shuffles.
// - attention_delta_rows: one warp per (b, t, h) row, delta = rowsum(dout * out).
// - attention_backward_dkdv: rows are keys. The block walks 32-query tiles from the first query
//   that sees its first key; dK and dV accumulate in registers (lane = head dim).
// - attention_backward_dq: rows are queries, over the same key tiles as the forward.
// Every gradient row has one owner: no atomics, deterministic. Tiles stay in the storage type
// (bf16 stays 2 bytes); arithmetic is scalar FMA in Acc<T>. bf16 tensor-core attention comes
// from cuDNN (attention_cudnn.h) where its shapes apply; MOD_CUDNN_ATTENTION=0 turns it off.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/cuda/cuda_backend.h"
#include "core/cuda/kernel_utils.cuh"
#include "core/cuda/ops/attention_cudnn.h"

namespace mod::cuda {

namespace {

constexpr int kWarps = 4;  // per block, every attention kernel
constexpr int kBlockThreads = kWarps * 32;
constexpr int kTile = 32;  // keys (forward, dq) or queries (dk, dv) per tile: one per lane
constexpr int kMaxHeadDim = 256;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // more needs cudaFuncSetAttribute

// Rows a warp owns: as many as keep one [rows][Dh/32] accumulator array within 32 registers per
// lane, at most 8. The largest block then needs 160.5 KiB of shared memory (f64, Dh = 256),
// within sm_80's 163 KiB.
template <typename T, int kMaxDh>
constexpr int rows_per_warp() {
  constexpr int regs = (kMaxDh / 32) * static_cast<int>(sizeof(Acc<T>) / 4);
  return 32 / regs < 8 ? 32 / regs : 8;
}
// Padding of a shared row that lane i reads as row i: one element (two for bf16), so the row
// stride is an odd number of 4-byte words (8-byte words for f64) and the 32 lanes hit distinct
// banks when Dh is even.
template <typename T>
constexpr int row_pad() {
  return sizeof(T) < 4 ? static_cast<int>(4 / sizeof(T)) : 1;
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// One [B, L] position tensor, i32 or i64.
struct Positions {
  const void* data;
  bool wide;  // i64
  __device__ int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

// Launch-invariant shape of one call: q [B,T,H,Dh], k,v [B,S,H,Dh], q_pos [B,T], k_pos [B,S].
struct Geometry {
  int64_t B, T, S, H, Dh;
  Positions q_pos, k_pos;
};

template <typename T, typename L>
struct ForwardParams {
  Geometry g;
  Acc<T> scale;  // 1/sqrt(Dh)
  const T *q, *k, *v;
  T* out;  // [B,T,H,Dh]
  L* lse;  // [B,H,T]
};

template <typename T, typename L>
struct BackwardParams {
  Geometry g;
  Acc<T> scale;
  const T *q, *k, *v, *dout;
  const L* lse;          // [B,H,T] from the forward
  const Acc<T>* delta;   // [B,H,T] rowsum(dout * out), from attention_delta_rows
  T *dq, *dk, *dv;
};

// Where a block works: its tile's first row and the offsets of its (b, h) slice.
struct BlockSlice {
  int64_t row0;          // the tile's first row (a query, or a key for dk/dv)
  int64_t stride;        // between rows of q, k, v: H * Dh
  int64_t q_off, k_off;  // element (b, 0, h, 0) of [B,T,H,Dh] and of [B,S,H,Dh]
  int64_t qp0, kp0;      // row b of q_pos [B,T] and of k_pos [B,S]
  int64_t stat0;         // element (b, h, 0) of lse and delta [B,H,T]
};

// Tile-major block order over the ceil(rows / block_rows) tiles of every (b, h) slice;
// `last_tiles_first` (query tiles: the last see the most keys) reverses the tiles, for balance.
__device__ __forceinline__ BlockSlice block_slice(const Geometry& g, int64_t rows, int block_rows,
                                                  bool last_tiles_first) {
  const int64_t block = blockIdx.x, bh = block % (g.B * g.H);
  const int64_t tiles = (rows + block_rows - 1) / block_rows, nth = block / (g.B * g.H);
  const int64_t tile = last_tiles_first ? tiles - 1 - nth : nth;
  const int64_t b = bh / g.H, h = bh % g.H;
  const int64_t q_off = (b * g.T * g.H + h) * g.Dh, k_off = (b * g.S * g.H + h) * g.Dh;
  return {tile * block_rows, g.H * g.Dh, q_off, k_off, b * g.T, b * g.S, (b * g.H + h) * g.T};
}

// First index in [0, n) whose position is >= x (n when none). Every thread of the block runs it
// on the same addresses (broadcast loads), so the result is block-uniform.
__device__ int64_t first_position_at_least(const Positions& pos, int64_t row0, int64_t n,
                                           int64_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (pos[row0 + mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Lanes [begin, end) spanning every set bit of a ballot (empty when it is 0).
__device__ __forceinline__ void lane_span(unsigned ballot, int& begin, int& end) {
  begin = ballot ? __ffs(static_cast<int>(ballot)) - 1 : 0;
  end = 32 - __clz(static_cast<int>(ballot));
}

// acc[r][c] += sum_j w[r]@lane j * rows_s[j][lane + 32 c]: lane j holds row r's weight for
// shared row j; only the lanes spanning a nonzero `any` (some row sees row j) take part.
template <int kRows, int kCols, typename A, typename T>
__device__ __forceinline__ void accumulate_lane_rows(A (&acc)[kRows][kCols], const A (&w)[kRows],
                                                     bool any, const T* rows_s, int ld, int dh,
                                                     int lane) {
  int j_begin, j_end;
  lane_span(__ballot_sync(kFullMask, any), j_begin, j_end);
  for (int jj = j_begin; jj < j_end; ++jj) {
    A x[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      x[c] = d < dh ? to_acc(rows_s[jj * ld + d]) : A(0);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const A wj = __shfl_sync(kFullMask, w[r], jj);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] += wj * x[c];
    }
  }
}

// dst [n][ld] (shared) = rows [row0, row0 + n) of one (b, h) slice: src at the slice's row 0,
// rows `stride` apart, `rows` of them. Rows past the end are zero, so a masked lane never
// multiplies garbage (0 * NaN). Warp w copies rows w, w + kWarps, ...; lanes stride the row.
template <typename T>
__device__ void stage_rows(const T* src, int64_t stride, int64_t row0, int64_t rows, int n,
                           int dh, T* dst, int ld, int warp, int lane) {
  for (int r = warp; r < n; r += kWarps) {
    const int64_t row = row0 + r;
    T* d = dst + r * ld;
    if (row < rows) {
      const T* s = src + row * stride;
      for (int e = lane; e < dh; e += 32) d[e] = s[e];
    } else {
      for (int e = lane; e < dh; e += 32) d[e] = from_acc<T>(Acc<T>(0));
    }
  }
}

// q [B,T,H,Dh], k,v [B,S,H,Dh] -> out [B,T,H,Dh], lse [B,H,T]. Grid: B*H*ceil(T/kBlockRows)
// blocks, the last query tiles (the most keys) first. Shared: q [kBlockRows][Dh], k [32][Dh+pad],
// v [32][Dh].
template <typename T, typename L, int kMaxDh>
__global__ void __launch_bounds__(kBlockThreads)
    attention_forward_flash(const ForwardParams<T, L> p) {
  using A = Acc<T>;
  constexpr int kRows = rows_per_warp<T, kMaxDh>(), kBlockRows = kWarps * kRows;
  constexpr int kCols = kMaxDh / 32;  // head dims per lane: lane + 32 c
  const Geometry& g = p.g;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dh = static_cast<int>(g.Dh), ldk = dh + row_pad<T>();
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = q_s + kBlockRows * dh;
  T* v_s = k_s + kTile * ldk;

  const auto [t0, stride, q_off, k_off, qp0, kp0, stat0] = block_slice(g, g.T, kBlockRows, true);
  stage_rows(p.q + q_off, stride, t0, g.T, kBlockRows, dh, q_s, dh, warp, lane);

  bool q_ok[kRows];
  int64_t qpos[kRows];
  A m[kRows], l[kRows], acc[kRows][kCols];
  bool warp_any = false;  // the warp owns a query row
  int64_t warp_q_last = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t t = t0 + warp * kRows + r;
    q_ok[r] = t < g.T;
    qpos[r] = q_ok[r] ? g.q_pos[qp0 + t] : 0;
    if (q_ok[r]) {
      warp_any = true;
      warp_q_last = qpos[r];
    }
    m[r] = A(-INFINITY);
    l[r] = A(0);
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = A(0);
  }
  const int64_t q_last = g.q_pos[qp0 + min64(g.T, t0 + kBlockRows) - 1];

  for (int64_t j0 = 0; j0 < g.S; j0 += kTile) {
    const int64_t first_key = g.k_pos[kp0 + j0];
    if (first_key > q_last) break;  // this tile and every later one is masked for all rows
    __syncthreads();                // the previous tile's readers are done
    stage_rows(p.k + k_off, stride, j0, g.S, kTile, dh, k_s, ldk, warp, lane);
    stage_rows(p.v + k_off, stride, j0, g.S, kTile, dh, v_s, dh, warp, lane);
    __syncthreads();
    if (!warp_any || first_key > warp_q_last) continue;  // warp-uniform: nothing visible here

    // s[r] = q_r . k_lane
    const int64_t j = j0 + lane;
    const bool k_ok = j < g.S;
    const int64_t kpos = k_ok ? g.k_pos[kp0 + j] : 0;
    A s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = A(0);
    const T* k_row = k_s + lane * ldk;
    const T* q_rows = q_s + warp * kRows * dh;
#pragma unroll 4
    for (int d = 0; d < dh; ++d) {
      const A kd = to_acc(k_row[d]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] += to_acc(q_rows[r * dh + d]) * kd;
    }

    // Online softmax: rescale the row's sum and accumulator to the new running max.
    A pr[kRows];
    bool lane_any = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool vis = k_ok && q_ok[r] && kpos <= qpos[r];
      lane_any |= vis;
      const A sr = vis ? s[r] * p.scale : A(-INFINITY);
      const A m_new = max(m[r], warp_max(sr));
      pr[r] = A(0);
      if (m_new == A(-INFINITY)) continue;  // warp-uniform: the row has seen no key yet
      const A corr = acc_exp(m[r] - m_new);  // 0 on the row's first visible tile
      pr[r] = vis ? acc_exp(sr - m_new) : A(0);
      l[r] = l[r] * corr + warp_sum(pr[r]);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] *= corr;
    }

    // acc[r] += sum_j P[r][j] v_j, over the keys some row of the warp sees.
    accumulate_lane_rows(acc, pr, lane_any, v_s, dh, dh, lane);
  }

  // A query that sees no key gets the empty sum: out 0, lse -inf (core/backend.h).
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!q_ok[r]) continue;
    const int64_t t = t0 + warp * kRows + r;
    const bool seen = m[r] != A(-INFINITY);
    const A inv = seen ? A(1) / l[r] : A(0);
    T* o_row = p.out + q_off + t * stride;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) o_row[d] = from_acc<T>(seen ? acc[r][c] * inv : A(0));
    }
    if (lane == 0) {
      const A lse = seen ? m[r] + acc_log(l[r]) : A(-INFINITY);
      p.lse[stat0 + t] = from_acc<L>(static_cast<Acc<L>>(lse));
    }
  }
}

// out, dout [B,T,H,Dh] -> delta [B,H,T] = rowsum(dout * out). One warp per (b, t, h) row,
// grid-striding over rows; lanes stride the row (coalesced), then a warp sum.
template <typename T>
__global__ void attention_delta_rows(const T* out, const T* dout, int64_t B, int64_t T_,
                                     int64_t H, int64_t Dh, Acc<T>* delta) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31, warps_per_block = blockDim.x >> 5;
  const int64_t rows = B * T_ * H;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps_per_block + (threadIdx.x >> 5);
       row < rows; row += warps) {
    const T* o = out + row * Dh;
    const T* g = dout + row * Dh;
    A sum = A(0);
    for (int64_t e = lane; e < Dh; e += 32) sum += to_acc(o[e]) * to_acc(g[e]);
    sum = warp_sum(sum);
    if (lane == 0) {
      const int64_t h = row % H, bt = row / H, t = bt % T_, b = bt / T_;
      delta[(b * H + h) * T_ + t] = sum;
    }
  }
}

// dk, dv [B,S,H,Dh] for a tile of kBlockRows keys across every query that sees them:
// dv_j = sum_i P_ij dout_i, dk_j = scale sum_i dS_ij q_i, dS_ij = P_ij (dout_i . v_j - delta_i).
// Grid: B*H*ceil(S/kBlockRows) blocks. Shared: k, v [kBlockRows][Dh], q, dout [32][Dh+pad].
template <typename T, typename L, int kMaxDh>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_dkdv(const BackwardParams<T, L> p) {
  using A = Acc<T>;
  constexpr int kRows = rows_per_warp<T, kMaxDh>(), kBlockRows = kWarps * kRows;
  constexpr int kCols = kMaxDh / 32;
  const Geometry& g = p.g;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dh = static_cast<int>(g.Dh), ldq = dh + row_pad<T>();
  extern __shared__ __align__(16) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem);
  T* v_s = k_s + kBlockRows * dh;
  T* q_s = v_s + kBlockRows * dh;
  T* do_s = q_s + kTile * ldq;

  // First key tiles (the most queries) first, for balance.
  const auto [s0, stride, q_off, k_off, qp0, kp0, stat0] = block_slice(g, g.S, kBlockRows, false);
  stage_rows(p.k + k_off, stride, s0, g.S, kBlockRows, dh, k_s, dh, warp, lane);
  stage_rows(p.v + k_off, stride, s0, g.S, kBlockRows, dh, v_s, dh, warp, lane);

  bool k_ok[kRows];
  int64_t kpos[kRows];
  A dk[kRows][kCols], dv[kRows][kCols];
  bool warp_any = false;  // the warp owns a key row
  int64_t warp_k_first = 0;
#pragma unroll
  for (int r = kRows - 1; r >= 0; --r) {
    const int64_t j = s0 + warp * kRows + r;
    k_ok[r] = j < g.S;
    kpos[r] = k_ok[r] ? g.k_pos[kp0 + j] : 0;
    if (k_ok[r]) {
      warp_any = true;
      warp_k_first = kpos[r];
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) dk[r][c] = dv[r][c] = A(0);
  }
  // Queries before the first that sees the block's first key see none of its keys.
  const int64_t i_first = first_position_at_least(g.q_pos, qp0, g.T, g.k_pos[kp0 + s0]);

  for (int64_t i0 = i_first; i0 < g.T; i0 += kTile) {
    __syncthreads();  // the previous tile's readers are done (and k_s, v_s staged)
    stage_rows(p.q + q_off, stride, i0, g.T, kTile, dh, q_s, ldq, warp, lane);
    stage_rows(p.dout + q_off, stride, i0, g.T, kTile, dh, do_s, ldq, warp, lane);
    __syncthreads();
    const int64_t tile_q_last = g.q_pos[qp0 + min64(g.T, i0 + kTile) - 1];
    if (!warp_any || warp_k_first > tile_q_last) continue;  // warp-uniform: nothing visible

    // s[r] = q_lane . k_r,  dp[r] = dout_lane . v_r
    const int64_t i = i0 + lane;
    const bool q_ok = i < g.T;
    const int64_t qpos = q_ok ? g.q_pos[qp0 + i] : 0;
    const A lse_i = q_ok ? static_cast<A>(load(p.lse + stat0 + i)) : A(0);
    const A delta_i = q_ok ? p.delta[stat0 + i] : A(0);
    A s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = A(0);
    const T* q_row = q_s + lane * ldq;
    const T* do_row = do_s + lane * ldq;
    const T* k_rows = k_s + warp * kRows * dh;
    const T* v_rows = v_s + warp * kRows * dh;
#pragma unroll 4
    for (int d = 0; d < dh; ++d) {
      const A qd = to_acc(q_row[d]), od = to_acc(do_row[d]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] += qd * to_acc(k_rows[r * dh + d]);
        dp[r] += od * to_acc(v_rows[r * dh + d]);
      }
    }

    // P = exp(scale s - lse), dS = P (dp - delta); exactly 0 where masked.
    A pr[kRows], ds[kRows];
    bool lane_any = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool vis = q_ok && k_ok[r] && kpos[r] <= qpos;
      lane_any |= vis;
      pr[r] = vis ? acc_exp(s[r] * p.scale - lse_i) : A(0);
      ds[r] = vis ? pr[r] * (dp[r] - delta_i) : A(0);
    }

    // dv[r] += sum_i P[i][r] dout_i,  dk[r] += sum_i dS[i][r] q_i, over the queries seen.
    int i_begin, i_end;
    lane_span(__ballot_sync(kFullMask, lane_any), i_begin, i_end);
    for (int ii = i_begin; ii < i_end; ++ii) {
      A qv[kCols], ov[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int d = lane + 32 * c;
        qv[c] = d < dh ? to_acc(q_s[ii * ldq + d]) : A(0);
        ov[c] = d < dh ? to_acc(do_s[ii * ldq + d]) : A(0);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const A pi = __shfl_sync(kFullMask, pr[r], ii);
        const A dsi = __shfl_sync(kFullMask, ds[r], ii);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          dv[r][c] += pi * ov[c];
          dk[r][c] += dsi * qv[c];
        }
      }
    }
  }

  // Keys no query sees keep zero gradients, as on the CPU.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!k_ok[r]) continue;
    const int64_t j = s0 + warp * kRows + r;
    T* dk_row = p.dk + k_off + j * stride;
    T* dv_row = p.dv + k_off + j * stride;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) {
        dk_row[d] = from_acc<T>(p.scale * dk[r][c]);
        dv_row[d] = from_acc<T>(dv[r][c]);
      }
    }
  }
}

// dq [B,T,H,Dh] = scale sum_j dS_ij k_j for a tile of kBlockRows queries, over key tiles up to
// the last one its last query sees. Grid: B*H*ceil(T/kBlockRows) blocks, last query tiles
// first. Shared: q, dout [kBlockRows][Dh], k, v [32][Dh+pad].
template <typename T, typename L, int kMaxDh>
__global__ void __launch_bounds__(kBlockThreads)
    attention_backward_dq(const BackwardParams<T, L> p) {
  using A = Acc<T>;
  constexpr int kRows = rows_per_warp<T, kMaxDh>(), kBlockRows = kWarps * kRows;
  constexpr int kCols = kMaxDh / 32;
  const Geometry& g = p.g;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dh = static_cast<int>(g.Dh), ldk = dh + row_pad<T>();
  extern __shared__ __align__(16) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem);
  T* do_s = q_s + kBlockRows * dh;
  T* k_s = do_s + kBlockRows * dh;
  T* v_s = k_s + kTile * ldk;

  const auto [t0, stride, q_off, k_off, qp0, kp0, stat0] = block_slice(g, g.T, kBlockRows, true);
  stage_rows(p.q + q_off, stride, t0, g.T, kBlockRows, dh, q_s, dh, warp, lane);
  stage_rows(p.dout + q_off, stride, t0, g.T, kBlockRows, dh, do_s, dh, warp, lane);

  bool q_ok[kRows];
  int64_t qpos[kRows];
  A lse[kRows], delta[kRows], acc[kRows][kCols];
  bool warp_any = false;
  int64_t warp_q_last = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t t = t0 + warp * kRows + r;
    q_ok[r] = t < g.T;
    qpos[r] = q_ok[r] ? g.q_pos[qp0 + t] : 0;
    lse[r] = q_ok[r] ? static_cast<A>(load(p.lse + stat0 + t)) : A(0);
    delta[r] = q_ok[r] ? p.delta[stat0 + t] : A(0);
    if (q_ok[r]) {
      warp_any = true;
      warp_q_last = qpos[r];
    }
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = A(0);
  }
  const int64_t q_last = g.q_pos[qp0 + min64(g.T, t0 + kBlockRows) - 1];

  for (int64_t j0 = 0; j0 < g.S; j0 += kTile) {
    const int64_t first_key = g.k_pos[kp0 + j0];
    if (first_key > q_last) break;  // this tile and every later one is masked for all rows
    __syncthreads();
    stage_rows(p.k + k_off, stride, j0, g.S, kTile, dh, k_s, ldk, warp, lane);
    stage_rows(p.v + k_off, stride, j0, g.S, kTile, dh, v_s, ldk, warp, lane);
    __syncthreads();
    if (!warp_any || first_key > warp_q_last) continue;

    // s[r] = q_r . k_lane,  dp[r] = dout_r . v_lane
    const int64_t j = j0 + lane;
    const bool k_ok = j < g.S;
    const int64_t kpos = k_ok ? g.k_pos[kp0 + j] : 0;
    A s[kRows], dp[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) s[r] = dp[r] = A(0);
    const T* k_row = k_s + lane * ldk;
    const T* v_row = v_s + lane * ldk;
    const T* q_rows = q_s + warp * kRows * dh;
    const T* do_rows = do_s + warp * kRows * dh;
#pragma unroll 4
    for (int d = 0; d < dh; ++d) {
      const A kd = to_acc(k_row[d]), vd = to_acc(v_row[d]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        s[r] += to_acc(q_rows[r * dh + d]) * kd;
        dp[r] += to_acc(do_rows[r * dh + d]) * vd;
      }
    }

    A ds[kRows];
    bool lane_any = false;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const bool vis = k_ok && q_ok[r] && kpos <= qpos[r];
      lane_any |= vis;
      const A pr = vis ? acc_exp(s[r] * p.scale - lse[r]) : A(0);
      ds[r] = vis ? pr * (dp[r] - delta[r]) : A(0);
    }

    // acc[r] += sum_j dS[r][j] k_j, over the keys some row of the warp sees.
    accumulate_lane_rows(acc, ds, lane_any, k_s, ldk, dh, lane);
  }

  // Queries that see no key get zero, as on the CPU.
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!q_ok[r]) continue;
    T* dq_row = p.dq + q_off + (t0 + warp * kRows + r) * stride;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < dh) dq_row[d] = from_acc<T>(p.scale * acc[r][c]);
    }
  }
}

// --- host side ---

// MOD_CUDNN_ATTENTION=0 sends every call to the kernels above (tests compare both paths).
bool cudnn_attention_allowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("MOD_CUDNN_ATTENTION");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return allowed;
}

void check_head_dim(const Tensor& q, const char* kernel) {
  const int64_t dh = q.size(3);
  if (dh < 1 || dh > kMaxHeadDim)
    throw std::invalid_argument(std::string(kernel) + ": head dim Dh = " + std::to_string(dh) +
                                " of q " + shape_str(q.shape()) +
                                " is outside the CUDA kernel's range 1.." +
                                std::to_string(kMaxHeadDim));
}

Positions positions(const Tensor& pos, const char* kernel) {
  if (pos.dtype() != DType::I32 && pos.dtype() != DType::I64)
    throw std::invalid_argument(std::string(kernel) + ": positions must be i32 or i64, got " +
                                dtype_name(pos.dtype()));
  return Positions{pos.raw_data(), pos.dtype() == DType::I64};
}

Geometry geometry(const Tensor& q, const Tensor& k, const Tensor& q_pos, const Tensor& k_pos,
                  const char* kernel) {
  return Geometry{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3),
                  positions(q_pos, kernel), positions(k_pos, kernel)};
}

// Calls f(std::integral_constant<int, kMaxDh>) for the smallest bucket holding Dh.
template <typename F>
void dispatch_head_dim(int64_t dh, F&& f) {
  if (dh <= 32)
    f(std::integral_constant<int, 32>{});
  else if (dh <= 64)
    f(std::integral_constant<int, 64>{});
  else if (dh <= 128)
    f(std::integral_constant<int, 128>{});
  else
    f(std::integral_constant<int, kMaxHeadDim>{});
}

int max_shared_bytes_optin() {
  static const int bytes = [] {
    int v = 0;
    MOD_CUDA_CHECK(
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
    return v;
  }();
  return bytes;
}

// Launches kernel<<<blocks, kBlockThreads, smem>>>(params) on the compute stream, opting in to
// more than 48 KiB of dynamic shared memory when it needs it.
template <typename Params>
void launch(void (*kernel)(Params), int64_t blocks, size_t smem, const Params& params,
            const char* name, const Tensor& q) {
  if (blocks > 0x7fffffff)
    throw std::invalid_argument(std::string(name) + ": " + std::to_string(blocks) +
                                " blocks for q " + shape_str(q.shape()) + " exceed the grid limit");
  if (smem > kDefaultSharedBytes) {
    if (smem > static_cast<size_t>(max_shared_bytes_optin()))
      throw std::runtime_error(std::string(name) + ": needs " + std::to_string(smem) +
                               " bytes of shared memory for q " + shape_str(q.shape()) +
                               ", the device allows " + std::to_string(max_shared_bytes_optin()));
    MOD_CUDA_CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(blocks), kBlockThreads, smem, compute_stream()>>>(params);
  MOD_CUDA_CHECK_LAUNCH();
}

}  // namespace

// q [B,T,H,Dh], k,v [B,S,H,Dh], q_pos [B,T], k_pos [B,S] -> out [B,T,H,Dh], lse [B,H,T].
void CudaBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& q_pos, const Tensor& k_pos, Tensor& out,
                                    Tensor& lse) {
  constexpr const char* kName = "attention_forward";
  check_head_dim(q, kName);
  if (q.numel() == 0) return;  // no query rows
  if (cudnn_attention_allowed() && cudnn_attention_forward(q, k, v, q_pos, k_pos, out, lse))
    return;
  const Geometry g = geometry(q, k, q_pos, k_pos, kName);
  dispatch_float(q.dtype(), kName, [&](auto zt) {
    using T = decltype(zt);
    dispatch_stats<T>(lse.dtype(), kName, [&](auto zl) {
      using L = decltype(zl);
      dispatch_head_dim(g.Dh, [&](auto max_dh) {
        constexpr int kMaxDh = decltype(max_dh)::value;
        constexpr int kBlockRows = kWarps * rows_per_warp<T, kMaxDh>();
        const int64_t dh = g.Dh, ldk = dh + row_pad<T>();
        const size_t smem = static_cast<size_t>(kBlockRows * dh + kTile * ldk + kTile * dh) *
                            sizeof(T);
        const ForwardParams<T, L> params{g,
                                         static_cast<Acc<T>>(1.0 / std::sqrt(double(dh))),
                                         q.data<T>(),
                                         k.data<T>(),
                                         v.data<T>(),
                                         out.data<T>(),
                                         lse.data<L>()};
        const int64_t blocks = g.B * g.H * ((g.T + kBlockRows - 1) / kBlockRows);
        launch(attention_forward_flash<T, L, kMaxDh>, blocks, smem, params, kName, q);
      });
    });
  });
}

// dout [B,T,H,Dh] with the forward's out and lse -> dq [B,T,H,Dh], dk, dv [B,S,H,Dh]. Three
// launches: delta = rowsum(dout * out), then dk/dv over key tiles, then dq over query tiles.
void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& q_pos, const Tensor& k_pos, const Tensor& out,
                                     const Tensor& lse, const Tensor& dout, Tensor& dq,
                                     Tensor& dk, Tensor& dv) {
  constexpr const char* kName = "attention_backward";
  check_head_dim(q, kName);
  if (q.numel() == 0 && k.numel() == 0) return;
  if (cudnn_attention_allowed() &&
      cudnn_attention_backward(q, k, v, q_pos, k_pos, out, lse, dout, dq, dk, dv))
    return;
  const Geometry g = geometry(q, k, q_pos, k_pos, kName);
  dispatch_float(q.dtype(), kName, [&](auto zt) {
    using T = decltype(zt);
    using A = Acc<T>;
    Tensor delta = Tensor::empty({g.B, g.H, g.T}, acc_dtype<T>(), Device::CUDA);
    if (q.numel() > 0) {
      const int64_t rows = g.B * g.T * g.H;
      attention_delta_rows<T><<<grid_for(rows * 32), kThreads, 0, compute_stream()>>>(
          out.data<T>(), dout.data<T>(), g.B, g.T, g.H, g.Dh, delta.data<A>());
      MOD_CUDA_CHECK_LAUNCH();
    }
    dispatch_stats<T>(lse.dtype(), kName, [&](auto zl) {
      using L = decltype(zl);
      dispatch_head_dim(g.Dh, [&](auto max_dh) {
        constexpr int kMaxDh = decltype(max_dh)::value;
        constexpr int kBlockRows = kWarps * rows_per_warp<T, kMaxDh>();
        const int64_t dh = g.Dh, ld = dh + row_pad<T>();
        const size_t smem = static_cast<size_t>(2 * kBlockRows * dh + 2 * kTile * ld) * sizeof(T);
        const BackwardParams<T, L> params{g,
                                          static_cast<A>(1.0 / std::sqrt(double(dh))),
                                          q.data<T>(),
                                          k.data<T>(),
                                          v.data<T>(),
                                          dout.data<T>(),
                                          lse.data<L>(),
                                          delta.data<A>(),
                                          dq.data<T>(),
                                          dk.data<T>(),
                                          dv.data<T>()};
        if (k.numel() > 0)
          launch(attention_backward_dkdv<T, L, kMaxDh>,
                 g.B * g.H * ((g.S + kBlockRows - 1) / kBlockRows), smem, params, kName, q);
        if (q.numel() > 0)
          launch(attention_backward_dq<T, L, kMaxDh>,
                 g.B * g.H * ((g.T + kBlockRows - 1) / kBlockRows), smem, params, kName, q);
      });
    });
  });
}

}  // namespace mod::cuda
