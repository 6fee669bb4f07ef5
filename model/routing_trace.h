// Where a trained MoD model sends the tokens of one sequence: for each routed block, the router
// score and the causal decision's probability of every token, and which tokens the block takes
// under top-C routing (training, sees the whole sequence) and under causal routing (sampling,
// decides token by token). `modtrain inspect` draws it (train/inspect.h).
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace mod::model {

struct BlockTrace {
  int block = 0;
  // Per token, on the top-C forward's inputs: router score r and the causal decision's
  // probability (predictor, or sigmoid of r without one).
  std::vector<double> router_score, decision_prob;
  std::vector<bool> top_c;   // selected by per-sequence top-C (exactly C tokens)
  std::vector<bool> causal;  // admitted by causal routing (its own forward's inputs)
  double agreement = 0;      // share of tokens on which top_c and causal agree
};

struct RoutingTrace {
  std::vector<int64_t> tokens;
  int64_t capacity = 0;  // C of the first routed block (all share it unless block_capacity says)
  std::vector<BlockTrace> blocks;  // routed blocks, in order
};

// tokens: one sequence of at most model.seq_len tokens. Runs one top-C and one causal forward
// without gradients. Throws for a model without routed blocks or with causal.method NONE.
RoutingTrace trace_routing(const Transformer& model, const std::vector<int64_t>& tokens);

// Per routed block, in block order: the share of the tokens of `tokens` [B,T] on which causal
// routing (sampling) makes the choice top-C routing (training) makes. Same preconditions.
std::vector<double> routing_agreement(const Transformer& model, const Tensor& tokens);

}  // namespace mod::model
