// A run's dataset and a model's loss on a shard set: the mean over its first batches in order,
// never sampled, so every evaluation of a model sees the same tokens.
#pragma once

#include <cstdint>
#include <string>

#include "model/transformer.h"
#include "parallel/communicator.h"
#include "train/data/dataset.h"

namespace mod::train {

// Opens the dataset in dir (data::Dataset::open); its vocabulary must match model.vocab_size.
data::Dataset load_dataset(const std::string& dir, int64_t model_vocab);

// Throws, naming the shard set, when it cannot fill one evaluation batch of batch x seq_len
// tokens (a run with validation checks this before its first step).
void check_evaluable(const data::ShardSet& tokens, int64_t seq_len, int64_t batch);

struct EvalResult {
  double loss = 0;  // mean over the evaluated batches
  int64_t tokens = 0;
};
// Under data parallelism (dp given), rank r of dp evaluates batches r, r + dp, ... and the
// result is reduced over dp; every rank returns the same value. lockstep: every dp rank runs as
// many forwards as the busiest one, since its forward is a collective over other dp ranks (experts
// over ep, whose ranks are dp ranks): a rank out of batches runs batch 0 again and counts nothing.
EvalResult evaluate(const model::Transformer& model, const data::ShardSet& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode,
                    parallel::Communicator* dp = nullptr, bool lockstep = false);

}  // namespace mod::train
