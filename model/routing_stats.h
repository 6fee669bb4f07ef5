// Statistics of a routed block for metrics: router score mean and spread, the causal decision's
// accuracy, precision and recall against top-C membership, and the top-C share per position
// bucket. The forward leaves the tensors on their device; resolve_stats reads them after the
// step, so the forward never waits for the host.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "core/util/histogram.h"

namespace mod::model {

// Statistics of one routed block from one forward (no gradient).
struct RoutedBlockStats {
  int block = 0;
  double router_mean = 0, router_std = 0;  // of r over all tokens
  // Causal decision (predictor, or router when there is no predictor) vs top-C membership.
  double accuracy = 0, precision = 0, recall = 0;
  std::vector<double> routed_fraction_by_bucket;  // top-C share per position bucket (8 buckets)
  util::Histogram router_histogram;               // of r over all tokens (TensorBoard)
  // Until resolve_stats: the detached router scores, decision logits and top-C membership
  // ([B,T] each), left on their device so that the forward never waits for the host. A causal
  // forward records one entry per sequence ([1,T]) whose member marks the tokens admitted.
  Tensor r, decision, member;
};

// Computes the numbers above from the tensors each entry holds (Backend::routing_summary on
// their device, one small copy to the host each), then drops them; entries already resolved are
// left alone.
void resolve_stats(std::vector<RoutedBlockStats>& stats);

}  // namespace mod::model
