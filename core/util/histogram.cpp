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
  const int n = h.max > h.min ? std::max(1, buckets) : 1;
  const double width = (h.max - h.min) / n;
  for (int i = 0; i < n; ++i) h.upper.push_back(i + 1 == n ? h.max : h.min + width * (i + 1));
  h.count.assign(n, 0.0);
  for (double v : values) {
    // The bucket whose (lower, upper] holds v; the minimum joins the first.
    auto it = std::lower_bound(h.upper.begin(), h.upper.end(), v);
    h.count[std::min<size_t>(it - h.upper.begin(), n - 1)] += 1;
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  return h;
}

}  // namespace mod::util
