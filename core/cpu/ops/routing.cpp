// CPU routing kernels for Mixture-of-Depths: per-row top-k selection, row gather and row
// scatter-add. Scatter-add is race-free without atomics: each task owns one batch entry and a
// range of D columns, so two selected rows hitting the same token never meet in two threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/dispatch.h"
#include "core/util/histogram.h"

namespace mod::cpu {

namespace {
// x [B,T,D], idx [B,C] -> out [B,C,D]; one row copy per (b, c).
template <typename T, typename I>
void gather_rows_copy(const T* x, const I* idx, T* out, int64_t b, int64_t t, int64_t c,
                      int64_t d) {
  const int64_t rows = b * c;
#pragma omp parallel for schedule(static) if (rows * d > kParallelElements)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out + r * d, x + ((r / c) * t + static_cast<int64_t>(idx[r])) * d,
                static_cast<size_t>(d) * sizeof(T));
}

// out [B,T,D] += src [B,C,D] scattered by idx [B,C]. Tasks are (b, column tile) pairs: about
// four per thread when B is small, tiles of whole 64-byte lines, repeats added in c order.
template <typename T, typename I>
void scatter_add_rows_tiled(const I* idx, const T* src, T* out, int64_t b, int64_t t, int64_t c,
                            int64_t d) {
  if (b * c * d == 0) return;
  constexpr int64_t kLine = 64 / sizeof(T);
  const int64_t threads = omp_get_max_threads();
  const int64_t want = std::clamp<int64_t>((4 * threads + b - 1) / b, 1, (d + kLine - 1) / kLine);
  const int64_t per_tile = (d + want - 1) / want;
  const int64_t tile = std::min(d, (per_tile + kLine - 1) / kLine * kLine);
  const int64_t tiles = (d + tile - 1) / tile;
#pragma omp parallel for schedule(static) if (b * c * d > kParallelElements)
  for (int64_t task = 0; task < b * tiles; ++task) {
    const int64_t bi = task / tiles, lo = (task % tiles) * tile, hi = std::min(d, lo + tile);
    for (int64_t ci = 0; ci < c; ++ci) {
      T* dst = out + (bi * t + static_cast<int64_t>(idx[bi * c + ci])) * d;
      const T* row = src + (bi * c + ci) * d;
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) dst[j] += row[j];
    }
  }
}

// scores [B,T] -> idx [B,k]: per row an O(T) selection under (score desc, position asc), then
// the chosen positions sorted ascending. NaN ranks below every number (as order_key does on the
// GPU), NaNs tied by position, so the order is total and a diverged router still selects.
template <typename T>
void topk_select_rows(const T* scores, int64_t b, int64_t t, int64_t k, int64_t* idx) {
  // Selection costs tens of ns per element, so parallelise well below the elementwise threshold.
#pragma omp parallel if (b > 1 && b * t > kParallelElements / 16)
  {
    std::vector<int64_t> pos(static_cast<size_t>(t));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < b; ++r) {
      const T* row = scores + r * t;
      std::iota(pos.begin(), pos.end(), int64_t{0});
      auto better = [row](int64_t i, int64_t j) {
        const bool nan_i = std::isnan(row[i]), nan_j = std::isnan(row[j]);
        if (nan_i || nan_j) return nan_i == nan_j ? i < j : nan_j;
        return row[i] > row[j] || (row[i] == row[j] && i < j);
      };
      if (k < t) std::nth_element(pos.begin(), pos.begin() + k, pos.end(), better);
      std::sort(pos.begin(), pos.begin() + k);
      std::copy(pos.begin(), pos.begin() + k, idx + r * k);
    }
  }
}
}  // namespace

// A pure copy, so integer rows (token positions) gather too.
void CpuBackend::gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) {
  auto dispatch = [&](auto&& f) {
    if (is_index(x.dtype()))
      dispatch_index(x.dtype(), "gather_rows", f);
    else
      dispatch_float(x.dtype(), "gather_rows", f);
  };
  dispatch([&](auto z) {
    using T = decltype(z);
    dispatch_index(idx.dtype(), "gather_rows", [&](auto zi) {
      using I = decltype(zi);
      gather_rows_copy(x.data<T>(), idx.data<I>(), out.data<T>(), x.size(0), x.size(1), idx.size(1),
                       x.size(2));
    });
  });
}

void CpuBackend::scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) {
  dispatch_float(out.dtype(), "scatter_add_rows", [&](auto z) {
    using T = decltype(z);
    dispatch_index(idx.dtype(), "scatter_add_rows", [&](auto zi) {
      using I = decltype(zi);
      scatter_add_rows_tiled(idx.data<I>(), src.data<T>(), out.data<T>(), out.size(0), out.size(1),
                             idx.size(1), out.size(2));
    });
  });
}

void CpuBackend::topk_rows(const Tensor& scores, int64_t k, Tensor& idx) {
  dispatch_float(scores.dtype(), "topk_rows", [&](auto z) {
    using T = decltype(z);
    topk_select_rows(scores.data<T>(), scores.size(0), scores.size(1), k, idx.data<int64_t>());
  });
}

// r, decision, member [R,T] -> out [RoutingSummary::kSize] (see backend.h): one pass for the
// sums, extremes and counts, a second for the histogram, whose bounds need the extremes.
void CpuBackend::routing_summary(const Tensor& r, const Tensor& decision, const Tensor& member,
                                 Tensor& out) {
  using S = RoutingSummary;
  S::check(r, decision, member, out);
  dispatch_float(r.dtype(), "routing_summary", [&](auto z) {
    using T = decltype(z);
    const T *pr = r.data<T>(), *pd = decision.data<T>(), *pm = member.data<T>();
    const int64_t n = r.numel(), t = r.size(-1);
    double* o = out.data<double>();
    std::fill_n(o, S::kSize, 0.0);
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (int64_t row = 0; row < n / t; ++row) {  // by rows: the position is the column
      for (int64_t pos = 0; pos < t; ++pos) {
        const int64_t i = row * t + pos;
        const double v = static_cast<double>(pr[i]);
        o[S::kSum] += v;
        o[S::kSumSquares] += v * v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        const bool said = static_cast<double>(pd[i]) > 0, is = static_cast<double>(pm[i]) > 0.5;
        o[S::kTruePositive] += said && is;
        o[S::kFalsePositive] += said && !is;
        o[S::kFalseNegative] += !said && is;
        o[S::kCorrect] += said == is;
        o[S::kMembersByBucket + pos * S::kPositionBuckets / t] += is;
      }
    }
    o[S::kMin] = lo;
    o[S::kMax] = hi;
    const std::vector<double> upper = util::histogram_upper_bounds(lo, hi, S::kHistogramBuckets);
    for (int64_t i = 0; i < n; ++i)
      o[S::kHistogram + util::histogram_bucket(static_cast<double>(pr[i]), lo, upper)] += 1;
  });
}

}  // namespace mod::cpu
