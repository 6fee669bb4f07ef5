// Autoregressive generation, batched: B prompts decode together through static per-block KV
// caches, each sequence with its own positions, routing decisions and cache lengths, sampled on
// the model's device (Transformer::decode_batch_step). Routed blocks admit a token iff the
// predictor (or router) says so, and cache only the tokens they admitted (transformer.h).
//
// Ragged prompts need no padding of positions: every sequence feeds position p at step p, the
// prompt's token while the prompt lasts and the sampled one after it, so a short prompt simply
// starts generating earlier (and finishes earlier; a finished sequence writes no cache).
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"

namespace mod::model {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // nucleus mass; 1: no filter
  uint64_t seed = 1;         // with the sequence's stream and position, keys each draw
  uint64_t first_stream = 0;  // sequence b of a batch draws from stream first_stream + b
  int64_t eot = -1;           // a generated eot ends its sequence (not kept); < 0: none
  int64_t read_every = 16;    // steps between reads of the done flags (the only host syncs)
  bool cuda_graph = true;     // on a GPU: the step captured once, replayed per token
};

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens only
  double seconds = 0;           // generation time of the whole batch (prompt included)
  // Per routed block: tokens admitted out of tokens seen (prompt and generated).
  std::vector<int64_t> admitted, seen;
};

// Feeds each prompt, then generates max_new tokens after it (fewer where model.seq_len or an
// eot ends it first); one Generation per prompt, in order. Sequence b equals prompts[b] decoded
// alone with first_stream + b as its first stream.
std::vector<Generation> generate_batch(const Transformer& model,
                                       const std::vector<std::vector<int64_t>>& prompts,
                                       int64_t max_new, const SamplingParams& params);
// One prompt: generate_batch's only sequence.
Generation generate(const Transformer& model, const std::vector<int64_t>& prompt, int64_t max_new,
                    const SamplingParams& params);

}  // namespace mod::model
