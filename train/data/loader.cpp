// WindowLoader and sequential validation batches (see loader.h).
#include "train/data/loader.h"

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

#include "train/data/permutation.h"

namespace mod::data {

namespace {
Batch read_windows(const ShardSet& shards, int64_t seq_len, int64_t rows,
                   const std::function<uint64_t(int64_t)>& window_of_row) {
  Batch b{Tensor::empty({rows, seq_len}, DType::I64), Tensor::empty({rows, seq_len}, DType::I64)};
  for (int64_t r = 0; r < rows; ++r)
    shards.read_window(window_of_row(r), seq_len, b.inputs.data<int64_t>() + r * seq_len,
                       b.targets.data<int64_t>() + r * seq_len);
  return b;
}
}  // namespace

WindowLoader::WindowLoader(ShardSet shards, int64_t seq_len, int64_t global_batch, uint64_t seed)
    : shards_(std::move(shards)), seq_len_(seq_len), global_batch_(global_batch) {
  state_.seed = seed;
  if (seq_len < 1 || global_batch < 1)
    throw std::invalid_argument("loader: seq_len and batch size must be positive");
  const uint64_t windows = shards_.windows(seq_len);
  if (windows < static_cast<uint64_t>(global_batch))
    throw std::invalid_argument(
        "loader: " + shards_.origin() + ": " + std::to_string(shards_.tokens()) + " tokens in " +
        std::to_string(shards_.files().size()) + " shard(s) give " + std::to_string(windows) +
        " windows of " + std::to_string(seq_len + 1) + " tokens, fewer than one global batch of " +
        std::to_string(global_batch) +
        " (give more data, or a smaller train.batch_size or "
        "model.seq_len)");
  batches_per_epoch_ = static_cast<int64_t>(windows / static_cast<uint64_t>(global_batch));
}

uint64_t WindowLoader::window(int64_t batch, int64_t row) const {
  const uint64_t epoch = static_cast<uint64_t>(batch / batches_per_epoch_);
  const uint64_t at = static_cast<uint64_t>((batch % batches_per_epoch_) * global_batch_ + row);
  const Permutation order(shards_.windows(seq_len_), state_.seed * 0x9E3779B97F4A7C15ull ^ epoch);
  return order(at);
}

WindowLoader::~WindowLoader() {
  if (prefetch_ && prefetch_->batch.valid()) prefetch_->batch.wait();
}

void WindowLoader::restore(const LoaderState& s) {
  state_ = s;  // a prefetch for another state no longer matches and is dropped by next()
}

Batch WindowLoader::next(int64_t row_begin, int64_t row_end) {
  if (row_begin < 0 || row_end > global_batch_ || row_begin >= row_end)
    throw std::invalid_argument("loader: rows [" + std::to_string(row_begin) + ", " +
                                std::to_string(row_end) + ") outside the global batch of " +
                                std::to_string(global_batch_));
  auto windows_of = [&](int64_t batch) {  // on this thread: window() reads state_
    std::vector<uint64_t> w(static_cast<size_t>(row_end - row_begin));
    for (size_t r = 0; r < w.size(); ++r) w[r] = window(batch, row_begin + static_cast<int64_t>(r));
    return w;
  };
  const int64_t rows = row_end - row_begin;
  std::optional<Prefetch> ready = std::exchange(prefetch_, std::nullopt);
  Batch b;
  if (ready && ready->state.seed == state_.seed &&
      ready->state.batches_drawn == state_.batches_drawn && ready->row_begin == row_begin &&
      ready->row_end == row_end) {
    b = ready->batch.get();  // rethrows what the read threw
    ++prefetched_;
  } else {  // none, or read for another state or rows (its future waits for it when dropped)
    const std::vector<uint64_t> w = windows_of(state_.batches_drawn);
    b = read_windows(shards_, seq_len_, rows, [&](int64_t r) { return w[r]; });
  }
  ++state_.batches_drawn;
  // The next batch, same rows, read while the caller works.
  prefetch_ = Prefetch{state_, row_begin, row_end, {}};
  prefetch_->batch = std::async(std::launch::async,
                                [this, rows, w = windows_of(state_.batches_drawn)] {
                                  return read_windows(shards_, seq_len_, rows,
                                                      [&](int64_t r) { return w[r]; });
                                });
  return b;
}

std::vector<Batch> sequential_batches(const ShardSet& shards, int64_t seq_len, int64_t batch,
                                      int64_t max_batches) {
  std::vector<Batch> out;
  const int64_t windows = static_cast<int64_t>(shards.windows(seq_len));
  for (int64_t first = 0; first + batch <= windows && static_cast<int64_t>(out.size()) < max_batches;
       first += batch)
    out.push_back(read_windows(shards, seq_len, batch, [&](int64_t r) { return first + r; }));
  return out;
}

}  // namespace mod::data
