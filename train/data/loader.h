// Random training windows. Window r of global batch n starts at an offset drawn from a stream
// seeded by (seed, n, r) alone, so the loader's whole position is one integer (batches drawn)
// and any data-parallel rank can produce exactly its rows of any batch: the position is
// layout-independent and survives a change of dp degree on resume.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace mod::data {

struct Batch {
  Tensor inputs;   // [rows, S] i64: tokens t .. t+S-1
  Tensor targets;  // [rows, S] i64: tokens t+1 .. t+S
};

struct LoaderState {
  uint64_t seed = 0;
  int64_t batches_drawn = 0;
};

class WindowLoader {
 public:
  WindowLoader(std::shared_ptr<const std::vector<uint32_t>> tokens, int64_t seq_len,
               int64_t global_batch, uint64_t seed);

  // Rows [row_begin, row_end) of the next global batch (a DP rank's slice); advances by one.
  Batch next(int64_t row_begin, int64_t row_end);
  Batch next() { return next(0, global_batch_); }
  // The start offset of window `row` of global batch `batch` (for tests and debugging).
  int64_t offset(int64_t batch, int64_t row) const;

  LoaderState state() const { return state_; }
  void restore(const LoaderState& s) { state_ = s; }
  int64_t global_batch() const { return global_batch_; }
  int64_t seq_len() const { return seq_len_; }

 private:
  std::shared_ptr<const std::vector<uint32_t>> tokens_;
  int64_t seq_len_, global_batch_;
  LoaderState state_;
};

// Consecutive non-overlapping windows from the start, for a deterministic validation loss.
std::vector<Batch> sequential_batches(const std::vector<uint32_t>& tokens, int64_t seq_len,
                                      int64_t batch, int64_t max_batches);

}  // namespace mod::data
