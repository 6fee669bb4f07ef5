// A run's token splits (train.bin, val.bin) and a model's loss on one: the mean over its first
// batches in order, never sampled, so every evaluation of a model sees the same tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parallel/communicator.h"

namespace mod::train {

struct DataSplits {
  std::shared_ptr<const std::vector<uint32_t>> train, val;
  uint32_t vocab_size = 0;
};
// Reads dir/train.bin and dir/val.bin; the vocabulary must match model.vocab_size.
DataSplits load_splits(const std::string& dir, int64_t model_vocab);

struct EvalResult {
  double loss = 0;  // mean over the evaluated batches
  int64_t tokens = 0;
};
// Under data parallelism (dp given), rank r of dp evaluates batches r, r + dp, ... and the
// result is reduced over dp; every rank returns the same value.
EvalResult evaluate(const model::Transformer& model, const std::vector<uint32_t>& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode,
                    parallel::Communicator* dp = nullptr);

}  // namespace mod::train
