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
    // The bucket whose (lower, upper] holds v; the minimum joins the first. The quotient lands
    // on it or next to it (rounding); the bounds settle which, as a binary search would.
    int k = width > 0 ? std::clamp(static_cast<int>((v - h.min) / width), 0, n - 1) : 0;
    while (k > 0 && v <= h.upper[k - 1]) --k;
    while (k < n - 1 && v > h.upper[k]) ++k;
    h.count[k] += 1;
    h.num += 1;
    h.sum += v;
    h.sum_squares += v * v;
  }
  return h;
}

}  // namespace mod::util
