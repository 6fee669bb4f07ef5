// The residual stream split over the sequence (parallel.sequence_parallel): the hooks with which
// parallelize (parallel/parallelize.h) tells a model that its stream between blocks holds only
// T/n positions of every sequence. The model stays unaware of ranks: it calls these where a
// routed block needs the whole sequence. Shape legend: B batch, T tokens, t = T/n the local
// positions, D width, C routed capacity.
//
// Invariant: everything these return is the same on every part (scores, rows, losses), so MoD's
// per-sequence top-C is taken once, identically, from all T positions.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace mod::model {

struct SequenceSplit {
  int64_t parts = 1;  // n: the stream holds T/n positions of every sequence
  using Unary = std::function<Tensor(const Tensor&)>;
  // [B,t] one scalar a position (router scores, decision logits) -> [B,T].
  Unary gather_scalars;
  // [B,T] -> [B,t], this part's positions (no autograd: membership targets).
  Unary own_positions;
  // A loss averaged over this part's positions -> the average over all of them.
  Unary average_loss;
  // x [B,t,D], idx [B,C] (positions in 0..T-1) -> the rows [B,C,D].
  std::function<Tensor(const Tensor& x, const Tensor& idx)> gather_rows;
  // x [B,t,D] plus, at idx [B,C], the rows of y [B,C,D] this part holds -> [B,t,D].
  std::function<Tensor(const Tensor& x, const Tensor& idx, const Tensor& y)> scatter_add_rows;
};

}  // namespace mod::model
