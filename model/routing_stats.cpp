// Routed-block statistics on the host (see routing_stats.h).
#include "model/routing_stats.h"

#include <algorithm>
#include <cmath>

namespace mod::model {

namespace {
// Router statistics for metrics from the tensors the forward left in s (resolve_stats). On a
// GPU this copies three [B,T] tensors to the host.
void fill_stats(RoutedBlockStats& s) {
  const std::vector<double> scores = s.r.to_vector(), decision_logits = s.decision.to_vector(),
                            member = s.member.to_vector();
  const int64_t n = s.r.numel(), t = s.r.size(-1);
  double sum = 0, sq = 0;
  for (double v : scores) {
    sum += v;
    sq += v * v;
  }
  s.router_histogram = util::make_histogram(scores);
  s.router_mean = sum / n;
  s.router_std = std::sqrt(std::max(0.0, sq / n - s.router_mean * s.router_mean));
  int64_t tp = 0, fp = 0, fn = 0, correct = 0;
  constexpr int kBuckets = 8;
  std::vector<double> routed(kBuckets, 0), total(kBuckets, 0);
  for (int64_t row = 0; row < n / t; ++row) {  // by rows: the position is the column
    for (int64_t pos = 0; pos < t; ++pos) {
      const int64_t i = row * t + pos;
      const bool said = decision_logits[i] > 0, is = member[i] > 0.5;
      tp += said && is;
      fp += said && !is;
      fn += !said && is;
      correct += said == is;
      const int bucket = static_cast<int>(pos * kBuckets / t);
      routed[bucket] += is;
      total[bucket] += 1;
    }
  }
  s.accuracy = static_cast<double>(correct) / n;
  s.precision = tp + fp ? static_cast<double>(tp) / (tp + fp) : 0.0;
  s.recall = tp + fn ? static_cast<double>(tp) / (tp + fn) : 0.0;
  s.routed_fraction_by_bucket.resize(kBuckets);
  for (int k = 0; k < kBuckets; ++k)
    s.routed_fraction_by_bucket[k] = total[k] ? routed[k] / total[k] : 0;
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
