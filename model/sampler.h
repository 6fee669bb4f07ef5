// Autoregressive generation with per-block KV caches. Routed blocks admit a token iff the
// predictor (or router) says so, and cache only the tokens they admitted (transformer.h).
#pragma once

#include <cstdint>
#include <vector>

#include "core/random.h"
#include "model/transformer.h"

namespace mod::model {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no top-k filter
  double top_p = 1.0;        // nucleus mass; 1: no filter
  uint64_t seed = 1;
};

// Draws one token from logits [V] under params.
int64_t sample_token(const Tensor& logits, const SamplingParams& params, Rng& rng);

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens only
  double seconds = 0;           // generation time (prompt included)
  // Per routed block: tokens admitted out of tokens seen (prompt and generated).
  std::vector<int64_t> admitted, seen;
};

// Feeds the prompt, then generates max_new tokens (stops early at the model's seq_len).
Generation generate(const Transformer& model, const std::vector<int64_t>& prompt,
                    int64_t max_new, const SamplingParams& params);

}  // namespace mod::model
