// A histogram of values in equal-width buckets, with the moments TensorBoard's histogram summary
// carries (min, max, count, sum, sum of squares). Built on the host from a copy that is read
// anyway (routing statistics), so nothing large is kept: only the bucket counts.
#pragma once

#include <cstdint>
#include <vector>

namespace mod::util {

struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  // Bucket i holds the values in (upper[i-1], upper[i]] (the first: [min, upper[0]]), as in
  // TensorBoard's HistogramProto (bucket_limit, bucket).
  std::vector<double> upper, count;
};

// `buckets` equal-width buckets from the smallest to the largest value (one bucket when all are
// equal; empty when there are no values).
Histogram make_histogram(const std::vector<double>& values, int buckets = 30);

// The two halves of make_histogram, for counts made elsewhere (a GPU kernel repeats them):
// the upper bounds of `buckets` buckets over [lo, hi] (one when lo == hi), bound i being
// fma(width, i + 1, lo) so that every device rounds it alike, the last exactly hi;
std::vector<double> histogram_upper_bounds(double lo, double hi, int buckets);
// and the bucket of v in lo..upper.back(): the quotient's guess, settled against the bounds.
int histogram_bucket(double v, double lo, const std::vector<double>& upper);

}  // namespace mod::util
