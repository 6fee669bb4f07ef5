// Routed-block statistics, reduced where the tensors are (see routing_stats.h).
#include "model/routing_stats.h"

#include <algorithm>
#include <cmath>

#include "core/backend.h"

namespace mod::model {

namespace {
// Router statistics for metrics from the tensors the forward left in s (resolve_stats): reduced
// on their device by routing_summary, so a GPU sends RoutingSummary::kSize numbers, not three
// [B,T] tensors for the host to walk.
void fill_stats(RoutedBlockStats& s) {
  using S = RoutingSummary;
  const Device device = s.r.device();
  const DType dtype = s.r.dtype();
  // A causal forward decides on the host; the summary wants all three where r is, alike.
  auto like_r = [&](const Tensor& x) {
    const Tensor y = x.to(device);
    return y.dtype() == dtype ? y : y.to(dtype);
  };
  const Tensor decision = like_r(s.decision), member = like_r(s.member);
  Tensor summary = Tensor::empty({S::kSize}, DType::F64, device);
  backend(device).routing_summary(s.r, decision, member, summary);
  const std::vector<double> v = summary.to_vector();
  const double n = static_cast<double>(s.r.numel());
  s.router_mean = v[S::kSum] / n;
  s.router_std = std::sqrt(std::max(0.0, v[S::kSumSquares] / n - s.router_mean * s.router_mean));
  util::Histogram& h = s.router_histogram;
  h.min = v[S::kMin];
  h.max = v[S::kMax];
  h.num = n;
  h.sum = v[S::kSum];
  h.sum_squares = v[S::kSumSquares];
  h.upper = util::histogram_upper_bounds(h.min, h.max, S::kHistogramBuckets);
  h.count.assign(v.begin() + S::kHistogram, v.begin() + S::kHistogram + h.upper.size());
  const double tp = v[S::kTruePositive], fp = v[S::kFalsePositive], fn = v[S::kFalseNegative];
  s.accuracy = v[S::kCorrect] / n;
  s.precision = tp + fp > 0 ? tp / (tp + fp) : 0.0;
  s.recall = tp + fn > 0 ? tp / (tp + fn) : 0.0;
  // Each bucket holds the positions p with p * 8 / T == k, in every row.
  const int64_t t = s.r.size(-1), rows = s.r.numel() / t;
  std::vector<double> total(S::kPositionBuckets, 0);
  for (int64_t pos = 0; pos < t; ++pos) total[pos * S::kPositionBuckets / t] += rows;
  s.routed_fraction_by_bucket.resize(S::kPositionBuckets);
  for (int k = 0; k < S::kPositionBuckets; ++k)
    s.routed_fraction_by_bucket[k] = total[k] > 0 ? v[S::kMembersByBucket + k] / total[k] : 0;
}

}  // namespace

void resolve_stats(std::vector<RoutedBlockStats>& stats) {
  for (auto& s : stats) {
    if (!s.r.defined()) continue;
    fill_stats(s);
    s.r = s.decision = s.member = Tensor();
  }
}

}  // namespace mod::model
