// What one forward of the model (model/transformer.h) returns: its logits, the losses backward
// runs on, and each routed block's and MoE layer's statistics and choices, in block order.
// Shape legend: B batch, T tokens, V vocabulary, C routed capacity.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "model/moe.h"
#include "model/routing_stats.h"

namespace mod::model {

struct ForwardResult {
  // [B,T,V] ([B,T,V/tp], this rank's vocabulary slice, under tensor parallelism); undefined
  // when the fused classifier computed the loss (Transformer::set_fused_classifier).
  Tensor logits;
  Tensor lm_loss;   // scalar; undefined without targets
  Tensor aux_loss;  // scalar: predictor BCE + weighted router BCE + MoE losses; undefined if none
  Tensor loss;      // lm_loss (+ aux_loss): what backward runs on
  Tensor hidden;    // [B,T,D]: a pipeline stage's output (Transformer::forward_stage), else undefined
  std::vector<RoutedBlockStats> stats;
  std::vector<MoeStats> moe_stats;  // per MoE layer run, in block order
  std::vector<Tensor> routed_idx;   // top-C mode: [B,C] i64 per routed block, in block order

  void add_aux_loss(const Tensor& term);  // aux_loss += term (aux_loss may be undefined)
};

}  // namespace mod::model
