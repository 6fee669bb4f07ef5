// Training windows in epochs. Epoch e visits the set's windows in a seeded permutation of its
// own (Permutation keyed by (seed, e)); global batch n of the run takes positions
// [(n mod P) B, (n mod P) B + B) of epoch n / P, where B is the global batch and P = floor(W / B)
// batches fill an epoch of W windows (the last W mod B windows of an epoch's order wait for the
// next one). So every window is seen once per epoch, the loader's whole position is one integer
// (batches drawn), and any data-parallel rank reads exactly its rows of any batch: the position
// is layout-independent and survives a change of dp degree on resume.
#pragma once

#include <cstdint>
#include <future>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "train/data/dataset.h"

namespace mod::data {

struct Batch {
  Tensor inputs;   // [rows, S] i64: tokens t .. t+S-1
  Tensor targets;  // [rows, S] i64: tokens t+1 .. t+S
};

struct LoaderState {
  uint64_t seed = 0;
  int64_t batches_drawn = 0;
};

// next() hands out a batch and starts reading the same rows of the following one in a
// background thread, so the reading (page faults on a cold or networked file system) overlaps
// the caller's step instead of opening the next one. The state is what was handed out: a
// prefetched batch not yet taken is not in it, and restore() drops it.
class WindowLoader {
 public:
  WindowLoader(ShardSet shards, int64_t seq_len, int64_t global_batch, uint64_t seed);
  ~WindowLoader();  // waits for a read in flight
  WindowLoader(const WindowLoader&) = delete;
  WindowLoader& operator=(const WindowLoader&) = delete;

  // Rows [row_begin, row_end) of the next global batch (a DP rank's slice); advances by one.
  Batch next(int64_t row_begin, int64_t row_end);
  Batch next() { return next(0, global_batch_); }
  // The window (ShardSet::read_window's index) of row `row` of global batch `batch`.
  uint64_t window(int64_t batch, int64_t row) const;

  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);
  int64_t global_batch() const { return global_batch_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t epoch() const { return state_.batches_drawn / batches_per_epoch_; }
  // Batches next() handed out from a finished or in-flight prefetch (the rest it read itself).
  int64_t prefetched() const { return prefetched_; }

 private:
  ShardSet shards_;
  int64_t seq_len_, global_batch_, batches_per_epoch_;
  LoaderState state_;
  struct Prefetch {
    LoaderState state;  // the state whose next batch this is
    int64_t row_begin = 0, row_end = 0;
    std::future<Batch> batch;
  };
  std::optional<Prefetch> prefetch_;
  int64_t prefetched_ = 0;
};

// Consecutive windows from the first, for a deterministic validation loss: up to max_batches
// batches of `batch` rows.
std::vector<Batch> sequential_batches(const ShardSet& shards, int64_t seq_len, int64_t batch,
                                      int64_t max_batches);

}  // namespace mod::data
