// CPU fused causal attention, FlashAttention-2 style: scores exist only as one tile per thread
// (at most kChunk x kTile), so extra memory is O(T + S) whatever T and S are. Positions are
// sorted, so the tile products skip every micro-block (8x32 with AVX-512, 6x16 with AVX2) past
// the causal boundary and only tiles straddling it are masked elementwise. Tile products run
// single-threaded inside OpenMP loops: a register-blocked micro-kernel for f32, the BLAS
// otherwise.
//
// FLOP convention (benchmarks): per visible (query, key) pair, forward does 2 GEMMs (S = QK^T,
// O += PV) = 4*Dh FLOPs and backward 5 (S recomputed, dV, dP, dQ, dK) = 10*Dh FLOPs; causal
// self-attention has T(T+1)/2 ~ T*S/2 visible pairs. Masked work is not counted.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#define MOD_ATTENTION_AVX2 1
#include <immintrin.h>
#endif

#include "core/cpu/blas.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/cpu/transpose.h"
#include "core/cpu/vec_math.h"

namespace mod::cpu {

namespace {
constexpr int64_t kTile = 64;    // queries per forward task; keys and queries per backward tile
constexpr int64_t kChunk = 256;  // keys per forward softmax step (one online rescale each)
constexpr int64_t kParallelWork = int64_t{1} << 20;  // B*H*T*S*Dh below which one thread runs

// f32 scores are kept in base-2 units (log2(e) folded into the scale of S = QK^T), so their
// exponentials are exp2_bounded; f64 (the gradient checks) keeps natural units and std::exp.
template <typename T>
constexpr T kScoreUnit = std::is_same_v<T, float> ? T(1.4426950408889634) : T(1);
template <typename T>
T exp_score(T x) {
  if constexpr (std::is_same_v<T, float>)
    return exp2_bounded(x);
  else
    return std::exp(x);
}

// One (b, h) slice of [B,L,H,Dh]: rows are Dh values, ld = H*Dh apart.
struct Dims {
  int64_t B, T, S, H, Dh;
  int64_t ld() const { return H * Dh; }
};

std::vector<int64_t> positions(const Tensor& pos) {
  std::vector<int64_t> p(static_cast<size_t>(pos.numel()));
  dispatch_index(pos.dtype(), "attention", [&](auto zi) {
    using I = decltype(zi);
    const I* src = pos.data<I>();
    for (size_t i = 0; i < p.size(); ++i) p[i] = src[i];
  });
  return p;
}

// First index in [p, p+n) with value > x (upper) or >= x (lower), as an offset.
int64_t upper(const int64_t* p, int64_t n, int64_t x) {
  return std::upper_bound(p, p + n, x) - p;
}
int64_t lower(const int64_t* p, int64_t n, int64_t x) {
  return std::lower_bound(p, p + n, x) - p;
}

#ifdef MOD_ATTENTION_AVX2
// Rows and columns of C a micro-kernel holds in registers.
struct Blocking {
  int mr, nr;
};

// C [MR, NR] = alpha * sum_p A(i,p) B[p, 0:NR] (+ C); A(i,p) = a[i*a_rs + p*a_cs]. The MR x NR
// accumulators stay in registers, each step p loads NR/W values of B (W floats a register) and
// broadcasts MR of A.
#ifdef __AVX512F__
// AVX-512: 8 x 32 (16 accumulators; 8 broadcasts and 2 loads a 16 FMAs). A 16 x 16 kernel
// spends a broadcast on every FMA and stays further from the FMA peak (docs/performance.md);
// narrow products (n a multiple of 16 but not 32) keep it.
#define MOD_SIMD(op) _mm512_##op
using Vec = __m512;
constexpr int kW = 16;
constexpr Blocking kWide{8, 32}, kNarrow{16, 16};
#else
// AVX2: 6 x 16 (12 accumulators).
#define MOD_SIMD(op) _mm256_##op
using Vec = __m256;
constexpr int kW = 8;
constexpr Blocking kWide{6, 16}, kNarrow{6, 16};
#endif
inline Vec vzero() {
  return MOD_SIMD(setzero_ps)();
}
inline Vec vset1(float x) {
  return MOD_SIMD(set1_ps)(x);
}
inline Vec vload(const float* p) {
  return MOD_SIMD(loadu_ps)(p);
}
inline void vstore(float* p, Vec v) {
  MOD_SIMD(storeu_ps)(p, v);
}
inline Vec vfma(Vec a, Vec b, Vec c) {
  return MOD_SIMD(fmadd_ps)(a, b, c);
}
inline Vec vmul(Vec a, Vec b) {
  return MOD_SIMD(mul_ps)(a, b);
}
inline Vec vadd(Vec a, Vec b) {
  return MOD_SIMD(add_ps)(a, b);
}
#undef MOD_SIMD

template <int MR, int NR>
void micro_kernel(int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t ldb, float alpha, bool accumulate, float* c, int64_t ldc) {
  constexpr int NV = NR / kW;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) acc[i][j] = vzero();
  // Rows in groups of 4 from one pointer each (row 4g + j at group[g] + j a_rs): 4 pointers and
  // 3 offsets fit in registers, where GCC's 16 row addresses spilled.
  const float* group[(MR + 3) / 4];
#pragma GCC unroll 4
  for (int g = 0; g < (MR + 3) / 4; ++g) group[g] = a + 4 * g * a_rs;
  const int64_t r1 = a_rs, r2 = 2 * a_rs, r3 = 3 * a_rs;
  for (int64_t p = 0; p < k; ++p) {
    Vec bp[NV];
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) bp[j] = vload(b + p * ldb + j * kW);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float* ag = group[i / 4];
      const Vec ai = vset1(i % 4 == 0 ? ag[0] : i % 4 == 1 ? ag[r1] : i % 4 == 2 ? ag[r2] : ag[r3]);
#pragma GCC unroll 2
      for (int j = 0; j < NV; ++j) acc[i][j] = vfma(ai, bp[j], acc[i][j]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < (MR + 3) / 4; ++g) group[g] += a_cs;
  }
  const Vec va = vset1(alpha);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NV; ++j) {
      float* cij = c + i * ldc + j * kW;
      Vec r = vmul(va, acc[i][j]);
      if (accumulate) r = vadd(r, vload(cij));
      vstore(cij, r);
    }
}

// An mr-row block (mr <= MR) with MR's kernel of fewer rows.
template <int MR, int NR>
void micro_block(int64_t mr, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                 int64_t ldb, float alpha, bool acc, float* c, int64_t ldc) {
  if constexpr (MR > 1)
    if (mr < MR) return micro_block<MR - 1, NR>(mr, k, a, a_rs, a_cs, b, ldb, alpha, acc, c, ldc);
  micro_kernel<MR, NR>(k, a, a_rs, a_cs, b, ldb, alpha, acc, c, ldc);
}

// The f32 tile product (see tile_gemm) in MR x NR blocks; n is a multiple of NR. When A's rows
// are strided (not packed: the forward reads K in place, its rows H*Dh apart), each block
// prefetches the next block's rows, which the hardware prefetchers, seeing many short streams,
// fetch late.
template <int MR, int NR, typename Range, typename Skip>
void blocked_gemm(bool ta, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float alpha, bool accumulate, float* c, int64_t ldc,
                  Range range, Skip skip) {
  const int64_t a_rs = ta ? 1 : lda, a_cs = ta ? lda : 1;
  const bool prefetch_rows = !ta && lda > k;
  for (int64_t i0 = 0; i0 < m; i0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, m - i0);
    const auto [k0, k1] = range(i0, mr);
    if (prefetch_rows)
      for (int64_t i = i0 + MR; i < std::min(m, i0 + 2 * MR); ++i)
        for (int64_t p = k0; p < k1; p += 64 / sizeof(float)) __builtin_prefetch(a + i * lda + p);
    for (int64_t j0 = 0; j0 < n; j0 += NR)
      if (!skip(i0, mr, j0, int64_t{NR}))
        micro_block<MR, NR>(mr, std::max<int64_t>(k1 - k0, 0), a + i0 * a_rs + k0 * a_cs, a_rs,
                            a_cs, b + k0 * ldb + j0, ldb, alpha, accumulate, c + i0 * ldc + j0,
                            ldc);
  }
}

#endif

using Span = std::pair<int64_t, int64_t>;
constexpr auto kNoSkip = [](int64_t, int64_t, int64_t, int64_t) { return false; };
auto all_of(int64_t k) {
  return [k](int64_t, int64_t) { return Span(0, k); };
}

// Tile GEMM with causal structure, B never transposed (NT products use a transposed copy):
// C [m,n] = alpha * op(A) B (+ C when accumulate), op(A) = A^T when ta. For each block of mr
// rows at i0, range(i0, mr) gives the k interval that can be nonzero, and skip(i0, mr, j0, nr)
// says the nr columns at j0 lie wholly past the causal boundary (left unwritten; the caller
// masks them). Only the micro-kernels (f32, n a multiple of 16) use them; the BLAS fallback
// computes the whole product, which is the same result.
template <typename T, typename Range, typename Skip = decltype(kNoSkip)>
void tile_gemm(bool ta, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, bool accumulate, T* c, int64_t ldc,
               [[maybe_unused]] Range range, [[maybe_unused]] Skip skip = kNoSkip) {
#ifdef MOD_ATTENTION_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (n % kWide.nr == 0)
      return blocked_gemm<kWide.mr, kWide.nr>(ta, m, n, k, a, lda, b, ldb, alpha, accumulate, c,
                                              ldc, range, skip);
    if (n % kNarrow.nr == 0)
      return blocked_gemm<kNarrow.mr, kNarrow.nr>(ta, m, n, k, a, lda, b, ldb, alpha, accumulate, c,
                                                  ldc, range, skip);
  }
#endif
  blas_gemm(ta, false, m, n, k, alpha, a, lda, b, ldb, accumulate ? T(1) : T(0), c, ldc);
}

// dst [dh, kTile] = src [rows, dh]^T (src rows ld apart).
template <typename T>
void transpose_tile(const T* src, int64_t ld, int64_t rows, int64_t dh, T* dst) {
#ifdef MOD_ATTENTION_AVX2
  if constexpr (std::is_same_v<T, float>) {
    if (rows % 8 == 0 && dh % 8 == 0) {
      for (int64_t r = 0; r < rows; r += 8)
        for (int64_t e = 0; e < dh; e += 8)
          transpose_8x8(src + r * ld + e, ld, dst + e * kTile + r, kTile);
      return;
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < dh; ++e) dst[e * kTile + r] = src[r * ld + e];
}

// Queries a softmax step handles at once: one AVX-512 register of f32.
constexpr int64_t kLanes = 16;
int64_t padded(int64_t rows) {
  return (rows + kLanes - 1) / kLanes * kLanes;
}

// One chunk's softmax step on St [cols, kTile]: mx = max(m, the column maxima), St =
// exp(St - mx) and sum = their column sums, for queries [0, rows) (lanes up to padded(rows)
// compute on whatever the tile holds and are never read). kLanes queries at a time, so the
// running max and sum stay in registers: over all queries at once they went through memory, a
// store-to-load chain per key.
template <typename T>
void chunk_softmax(T* st, int64_t cols, int64_t rows, const T* m, T* mx, T* sum) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    T x0[kLanes], x1[kLanes], sv[kLanes] = {};
    for (int64_t r = 0; r < kLanes; ++r) x0[r] = x1[r] = m[r0 + r];
    int64_t c = 0;
    for (; c + 1 < cols; c += 2) {  // two maxima, two dependency chains
      const T* s0 = st + c * kTile + r0;
      const T* s1 = s0 + kTile;
#pragma omp simd
      for (int64_t r = 0; r < kLanes; ++r) {
        x0[r] = s0[r] > x0[r] ? s0[r] : x0[r];
        x1[r] = s1[r] > x1[r] ? s1[r] : x1[r];
      }
    }
    if (c < cols) {
      const T* s0 = st + c * kTile + r0;
#pragma omp simd
      for (int64_t r = 0; r < kLanes; ++r) x0[r] = s0[r] > x0[r] ? s0[r] : x0[r];
    }
#pragma omp simd
    for (int64_t r = 0; r < kLanes; ++r) x0[r] = x1[r] > x0[r] ? x1[r] : x0[r];
    for (c = 0; c < cols; ++c) {  // a query that sees no key gets NaN here; replaced at the end
      T* sc = st + c * kTile + r0;
#pragma omp simd
      for (int64_t r = 0; r < kLanes; ++r) {
        sc[r] = exp_score(sc[r] - x0[r]);
        sv[r] += sc[r];
      }
    }
    std::copy_n(x0, kLanes, mx + r0);
    std::copy_n(sv, kLanes, sum + r0);
  }
}

// Forward of one (b, h, query tile), on transposed scores St [keys, queries] so the softmax
// over keys runs down columns, vectorised across queries; online rescale once per kChunk keys.
// q,out at the tile's first row (ld); k,v at the slice's key 0 (ld); qp [rows]; kp [S];
// lse [rows]. scratch: st [kChunk*kTile], qt [Dh*kTile], acc [kTile*Dh], m,l,mx,sum [kTile].
template <typename T>
void forward_tile(const Dims& d, int64_t rows, const T* q, const T* k, const T* v,
                  const int64_t* qp, const int64_t* kp, T* out, T* lse, T* st, T* qt, T* acc, T* m,
                  T* l, T* mx, T* sum) {
  const int64_t ld = d.ld(), dh = d.Dh;
  const T scale = static_cast<T>(kScoreUnit<T> / std::sqrt(static_cast<double>(dh)));  // S units
  const T neg_inf = -std::numeric_limits<T>::infinity();
  transpose_tile(q, ld, rows, dh, qt);
  std::fill(m, m + padded(rows), neg_inf);
  std::fill(l, l + rows, T(0));
  std::fill(acc, acc + rows * dh, T(0));
  const int64_t kend = upper(kp, d.S, qp[rows - 1]);
  for (int64_t s0 = 0; s0 < kend; s0 += kChunk) {
    const int64_t cols = std::min(kChunk, kend - s0);
    const int64_t* kpc = kp + s0;
    // St = scale K Q^T, skipping blocks whose first key is later than their last query.
    tile_gemm(
        false, cols, rows, dh, scale, k + s0 * ld, ld, qt, kTile, false, st, kTile, all_of(dh),
        [&](int64_t i0, int64_t, int64_t j0, int64_t nr) { return kpc[i0] > qp[j0 + nr - 1]; });
    for (int64_t c = upper(kpc, cols, qp[0]); c < cols; ++c) {  // keys later than some query
      T* sc = st + c * kTile;
      const int64_t p = kpc[c];
#pragma omp simd
      for (int64_t r = 0; r < rows; ++r) sc[r] = p > qp[r] ? neg_inf : sc[r];
    }
    chunk_softmax(st, cols, rows, m, mx, sum);
    for (int64_t r = 0; r < rows; ++r) {
      const T corr = exp_score(m[r] - mx[r]);  // 0 on the first chunk (m = -inf)
      l[r] = l[r] * corr + sum[r];
      m[r] = mx[r];
      if (s0 == 0) continue;
      T* ar = acc + r * dh;
#pragma omp simd
      for (int64_t e = 0; e < dh; ++e) ar[e] *= corr;
    }
    // acc += P V, each query block stopping at its last visible key.
    tile_gemm(true, rows, dh, cols, T(1), st, kTile, v + s0 * ld, ld, true, acc, dh,
              [&](int64_t i0, int64_t mr) { return Span(0, upper(kpc, cols, qp[i0 + mr - 1])); });
  }
  for (int64_t r = 0; r < rows; ++r) {
    T* orow = out + r * ld;
    if (d.S == 0 || kp[0] > qp[r]) {  // sees no key: the empty sum (core/backend.h)
      std::fill(orow, orow + dh, T(0));
      lse[r] = neg_inf;
      continue;
    }
    const T inv = T(1) / l[r];
    const T* ar = acc + r * dh;
#pragma omp simd
    for (int64_t e = 0; e < dh; ++e) orow[e] = ar[e] * inv;
    lse[r] = m[r] / kScoreUnit<T> + std::log(l[r]);
  }
}

// A head's rows are ld = H*Dh apart, each a fresh stream the hardware prefetcher does not
// follow across pages, so the packing loops prefetch kAhead rows ahead.
constexpr int64_t kAhead = 16;
template <typename T>
void prefetch_row(const T* row, int64_t dh) {
  for (int64_t e = 0; e < dh; e += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(row + e);
}

// dst [rows, dh] = the rows of src (ld apart).
template <typename T>
void pack_rows(const T* src, int64_t ld, int64_t rows, int64_t dh, T* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kAhead < rows) prefetch_row(src + (r + kAhead) * ld, dh);
    const T* sr = src + r * ld;
    T* dr = dst + r * dh;
#pragma omp simd
    for (int64_t e = 0; e < dh; ++e) dr[e] = sr[e];
  }
}

// dst [rows, dh] = the rows of dout, and delta [rows] = rowsum(dout * o), in one pass.
template <typename T>
void pack_dout_delta(const T* o, const T* dout, int64_t ld, int64_t rows, int64_t dh, T* dst,
                     T* delta) {
  for (int64_t r = 0; r < rows; ++r) {
    if (r + kAhead < rows) {
      prefetch_row(o + (r + kAhead) * ld, dh);
      prefetch_row(dout + (r + kAhead) * ld, dh);
    }
    const T *orow = o + r * ld, *grow = dout + r * ld;
    T* dr = dst + r * dh;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t e = 0; e < dh; ++e) {
      sum += orow[e] * grow[e];
      dr[e] = grow[e];
    }
    delta[r] = sum;
  }
}

// One thread's buffers for backward_head: a head's inputs packed contiguously (strided rows
// conflict in the caches: at ld = 2 KB a [512, 64] slice maps to 1/8 of the L2's sets), dQ's
// accumulator, and the tiles.
template <typename T>
struct BackwardScratch {
  std::vector<T> q, dout, dq, k, v;                     // [T,Dh] x3, [S,Dh] x2
  std::vector<T> delta;                                 // [T]
  std::vector<T> s, dp, kt, vt, dk_acc, dv_acc;         // [kTile*kTile] x2, [Dh*kTile] x4
  explicit BackwardScratch(const Dims& d)
      : q(d.T * d.Dh), dout(d.T * d.Dh), dq(d.T * d.Dh), k(d.S * d.Dh), v(d.S * d.Dh),
        delta(d.T), s(kTile * kTile), dp(kTile * kTile), kt(d.Dh * kTile), vt(d.Dh * kTile),
        dk_acc(kTile * d.Dh), dv_acc(kTile * d.Dh) {}
};

// Backward of one (b, h), key tiles outer so dK, dV accumulate in contiguous tiles. Reads the
// packed q, dout [T,Dh], k, v [S,Dh] and delta [T] of w; accumulates dQ in w.dq (scaled);
// writes dk, dv (rows ld_out apart). lse [T], qp [T], kp [S].
template <typename T>
void backward_head(const Dims& d, BackwardScratch<T>& w, const T* lse, const int64_t* qp,
                   const int64_t* kp, T* dk, T* dv, int64_t ld_out) {
  const int64_t ld = d.Dh, dh = d.Dh;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(dh)));
  const T *q = w.q.data(), *k = w.k.data(), *v = w.v.data(), *dout = w.dout.data();
  const T* delta = w.delta.data();
  T *dq = w.dq.data(), *s = w.s.data(), *dp = w.dp.data(), *kt = w.kt.data(), *vt = w.vt.data();
  T *dk_acc = w.dk_acc.data(), *dv_acc = w.dv_acc.data();
  std::fill(w.dq.begin(), w.dq.end(), T(0));
  for (int64_t s0 = 0; s0 < d.S; s0 += kTile) {
    const int64_t cols = std::min(kTile, d.S - s0);
    const int64_t* kpt = kp + s0;
    std::fill(dk_acc, dk_acc + cols * dh, T(0));
    std::fill(dv_acc, dv_acc + cols * dh, T(0));
    // Query tiles start at the first query that sees this tile's first key.
    const int64_t t_first = lower(qp, d.T, kpt[0]);
    if (t_first < d.T) {
      transpose_tile(k + s0 * ld, ld, cols, dh, kt);
      transpose_tile(v + s0 * ld, ld, cols, dh, vt);
    }
    for (int64_t t0 = t_first; t0 < d.T; t0 += kTile) {
      const int64_t rows = std::min(kTile, d.T - t0);
      const int64_t* qpt = qp + t0;
      const T* qt = q + t0 * ld;
      const T* gt = dout + t0 * ld;
      const bool boundary = kpt[cols - 1] > qpt[0];
      // Score-shaped products [rows, cols] skip blocks wholly past the boundary; key-row
      // products start at the first query that sees the block, query-row products stop at
      // the last key the block sees.
      auto past = [&](int64_t i0, int64_t mr, int64_t j0, int64_t) {
        return kpt[j0] > qpt[i0 + mr - 1];
      };
      auto from_query = [&](int64_t i0, int64_t) { return Span(lower(qpt, rows, kpt[i0]), rows); };
      auto to_key = [&](int64_t i0, int64_t mr) {
        return Span(0, upper(kpt, cols, qpt[i0 + mr - 1]));
      };
      auto mask = [&](T* x, T masked) {
        for (int64_t r = 0; r < rows; ++r) {
          T* xr = x + r * kTile;
          const int64_t p = qpt[r];
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) xr[c] = kpt[c] > p ? masked : xr[c];
        }
      };
      tile_gemm(false, rows, cols, dh, scale * kScoreUnit<T>, qt, ld, kt, kTile, false, s, kTile,
                all_of(dh), past);
      if (boundary) mask(s, -std::numeric_limits<T>::infinity());
      for (int64_t r = 0; r < rows; ++r) {  // P = exp(S - lse)
        T* sr = s + r * kTile;
        const T lr = lse[t0 + r] * kScoreUnit<T>;
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) sr[c] = exp_score(sr[c] - lr);
      }
      // dV += P^T dO;  dP = dO V^T
      tile_gemm(true, cols, dh, rows, T(1), s, kTile, gt, ld, true, dv_acc, dh, from_query);
      tile_gemm(false, rows, cols, dh, T(1), gt, ld, vt, kTile, false, dp, kTile, all_of(dh), past);
      if (boundary) mask(dp, T(0));         // skipped blocks hold garbage
      for (int64_t r = 0; r < rows; ++r) {  // dS = P * (dP - delta)
        const T* sr = s + r * kTile;
        T* dr = dp + r * kTile;
        const T dl = delta[t0 + r];
#pragma omp simd
        for (int64_t c = 0; c < cols; ++c) dr[c] = sr[c] * (dr[c] - dl);
      }
      // dQ += scale dS K;  dK += dS^T Q (scaled once at the end)
      tile_gemm(false, rows, dh, cols, scale, dp, kTile, k + s0 * ld, ld, true, dq + t0 * ld, ld,
                to_key);
      tile_gemm(true, cols, dh, rows, T(1), dp, kTile, qt, ld, true, dk_acc, dh, from_query);
    }
    for (int64_t c = 0; c < cols; ++c) {
      T* dkrow = dk + (s0 + c) * ld_out;
      T* dvrow = dv + (s0 + c) * ld_out;
      const T* ka = dk_acc + c * dh;
      const T* va = dv_acc + c * dh;
#pragma omp simd
      for (int64_t e = 0; e < dh; ++e) {
        dkrow[e] = scale * ka[e];
        dvrow[e] = va[e];
      }
    }
  }
}
}  // namespace

// q [B,T,H,Dh], k,v [B,S,H,Dh], q_pos [B,T], k_pos [B,S] -> out [B,T,H,Dh], lse [B,H,T].
// Parallel over (b, h, query tile); later query tiles see more keys, so scheduled dynamically.
void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& q_pos, const Tensor& k_pos, Tensor& out,
                                   Tensor& lse) {
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  const std::vector<int64_t> qp = positions(q_pos), kp = positions(k_pos);
  const int64_t qtiles = (d.T + kTile - 1) / kTile;
  const int64_t tasks = d.B * d.H * qtiles;
  dispatch_float(q.dtype(), "attention_forward", [&](auto z) {
    using T = decltype(z);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>();
    T *po = out.data<T>(), *pl = lse.data<T>();
#pragma omp parallel if (d.B * d.H * d.T * d.S * d.Dh > kParallelWork)
    {
      std::vector<T> st(kChunk * kTile), qt(d.Dh * kTile), acc(kTile * d.Dh), stats(4 * kTile);
      T* st4 = stats.data();
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        // Heaviest (last) query tiles first, for a better dynamic balance.
        const int64_t qtile = qtiles - 1 - task % qtiles, bh = task / qtiles;
        const int64_t b = bh / d.H, h = bh % d.H, t0 = qtile * kTile;
        const int64_t rows = std::min(kTile, d.T - t0);
        const int64_t qoff = ((b * d.T + t0) * d.H + h) * d.Dh;
        const int64_t koff = (b * d.S * d.H + h) * d.Dh;
        forward_tile<T>(d, rows, pq + qoff, pk + koff, pv + koff, qp.data() + b * d.T + t0,
                        kp.data() + b * d.S, po + qoff, pl + bh * d.T + t0, st.data(), qt.data(),
                        acc.data(), st4, st4 + kTile, st4 + 2 * kTile, st4 + 3 * kTile);
      }
    }
  });
}

// Parallel over (b, h): each task owns its slices of dq, dk, dv, so there are no write races.
// A task packs its head's inputs first (delta_t = rowsum(dO * O) in the same pass over dO).
void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& q_pos, const Tensor& k_pos, const Tensor& out,
                                    const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                    Tensor& dv) {
  const Dims d{q.size(0), q.size(1), k.size(1), q.size(2), q.size(3)};
  const std::vector<int64_t> qp = positions(q_pos), kp = positions(k_pos);
  dispatch_float(q.dtype(), "attention_backward", [&](auto z) {
    using T = decltype(z);
    const T *pq = q.data<T>(), *pk = k.data<T>(), *pv = v.data<T>(), *po = out.data<T>();
    const T *pg = dout.data<T>(), *pl = lse.data<T>();
    T *pdq = dq.data<T>(), *pdk = dk.data<T>(), *pdv = dv.data<T>();
    const int64_t ld = d.ld(), dh = d.Dh;
#pragma omp parallel if (d.B * d.H * d.T * d.S * d.Dh > kParallelWork)
    {
      BackwardScratch<T> w(d);
#pragma omp for schedule(dynamic, 1)
      for (int64_t bh = 0; bh < d.B * d.H; ++bh) {
        const int64_t b = bh / d.H, h = bh % d.H;
        const int64_t qoff = (b * d.T * d.H + h) * d.Dh;
        const int64_t koff = (b * d.S * d.H + h) * d.Dh;
        pack_dout_delta(po + qoff, pg + qoff, ld, d.T, dh, w.dout.data(), w.delta.data());
        pack_rows(pq + qoff, ld, d.T, dh, w.q.data());
        pack_rows(pk + koff, ld, d.S, dh, w.k.data());
        pack_rows(pv + koff, ld, d.S, dh, w.v.data());
        backward_head<T>(d, w, pl + bh * d.T, qp.data() + b * d.T, kp.data() + b * d.S,
                         pdk + koff, pdv + koff, ld);
        for (int64_t t = 0; t < d.T; ++t) std::copy_n(w.dq.data() + t * dh, dh, pdq + qoff + t * ld);
      }
    }
  });
}

}  // namespace mod::cpu
