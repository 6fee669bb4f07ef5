// WindowLoader and sequential validation batches (see loader.h).
#include "train/data/loader.h"

#include <stdexcept>
#include <string>

#include "core/random.h"

namespace mod::data {

WindowLoader::WindowLoader(std::shared_ptr<const std::vector<uint32_t>> tokens, int64_t seq_len,
                           int64_t global_batch, uint64_t seed)
    : tokens_(std::move(tokens)), seq_len_(seq_len), global_batch_(global_batch) {
  state_.seed = seed;
  const int64_t n = static_cast<int64_t>(tokens_->size());
  if (seq_len < 1 || global_batch < 1)
    throw std::invalid_argument("loader: seq_len and batch size must be positive");
  if (n < seq_len + 2)
    throw std::invalid_argument("loader: " + std::to_string(n) + " tokens cannot fill one window of " +
                                std::to_string(seq_len + 1));
}

int64_t WindowLoader::offset(int64_t batch, int64_t row) const {
  // An independent stream per (seed, batch, row): mixing through splitmix inside Rng.
  Rng rng(state_.seed * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(batch) << 20) ^
          static_cast<uint64_t>(row));
  return rng.below(static_cast<int64_t>(tokens_->size()) - seq_len_);
}

Batch WindowLoader::next(int64_t row_begin, int64_t row_end) {
  if (row_begin < 0 || row_end > global_batch_ || row_begin >= row_end)
    throw std::invalid_argument("loader: rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") outside the global batch of " +
                                std::to_string(global_batch_));
  const int64_t rows = row_end - row_begin;
  Batch b{Tensor::empty({rows, seq_len_}, DType::I64), Tensor::empty({rows, seq_len_}, DType::I64)};
  int64_t* in = b.inputs.data<int64_t>();
  int64_t* tg = b.targets.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t start = offset(state_.batches_drawn, row_begin + r);
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[r * seq_len_ + t] = (*tokens_)[start + t];
      tg[r * seq_len_ + t] = (*tokens_)[start + t + 1];
    }
  }
  ++state_.batches_drawn;
  return b;
}

std::vector<Batch> sequential_batches(const std::vector<uint32_t>& tokens, int64_t seq_len,
                                      int64_t batch, int64_t max_batches) {
  std::vector<Batch> out;
  const int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / seq_len;
  for (int64_t first = 0; first + batch <= windows && static_cast<int64_t>(out.size()) < max_batches;
       first += batch) {
    Batch b{Tensor::empty({batch, seq_len}, DType::I64), Tensor::empty({batch, seq_len}, DType::I64)};
    for (int64_t r = 0; r < batch; ++r)
      for (int64_t t = 0; t < seq_len; ++t) {
        const int64_t at = (first + r) * seq_len + t;
        b.inputs.data<int64_t>()[r * seq_len + t] = tokens[at];
        b.targets.data<int64_t>()[r * seq_len + t] = tokens[at + 1];
      }
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace mod::data
