// Equal-width histograms (see histogram.h).
#include "core/util/histogram.h"

#include <algorithm>
#include <cmath>

namespace mod::util {

Histogram make_histogram(const std::vector<double>& values, int buckets) {
  Histogram h;
  if (values.empty()) return h;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  h.min = *lo;
  h.max = *hi;
  h.upper = histogram_upper_bounds(h.min, h.max, buckets);
  h.count.assign(h.upper.size(), 0.0);
  for (double v : values) {
    h.count[histogram_bucket(v, h.min, h.upper)] += 1;
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  return h;
}

std::vector<double> histogram_upper_bounds(double lo, double hi, int buckets) {
  const int n = hi > lo ? std::max(1, buckets) : 1;
  const double width = (hi - lo) / n;
  std::vector<double> upper;
  for (int i = 0; i < n; ++i) upper.push_back(i + 1 == n ? hi : std::fma(width, i + 1.0, lo));
  return upper;
}

int histogram_bucket(double v, double lo, const std::vector<double>& upper) {
  // The bucket whose (lower, upper] holds v; the minimum joins the first. The quotient lands
  // on it or next to it (rounding); the bounds settle which, as a binary search would.
  const int n = static_cast<int>(upper.size());
  const double width = (upper.back() - lo) / n;
  int k = width > 0 ? std::clamp(static_cast<int>((v - lo) / width), 0, n - 1) : 0;
  while (k > 0 && v <= upper[k - 1]) --k;
  while (k < n - 1 && v > upper[k]) ++k;
  return k;
}

}  // namespace mod::util
