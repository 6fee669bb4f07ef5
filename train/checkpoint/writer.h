// Saving checkpoints, collectively over a communicator (a world of one needs no MPI).
//
// save(entries, state) on every rank, in this order:
//   1. prepare (collective): every rank checks its entries; rank 0 removes leftover *.tmp
//      from a crash and creates checkpoints/step_N.tmp/; every rank learns the outcome.
//   2. each rank writes its writer entries to step_N.tmp/shard_<rank>.bin and fsyncs it
//      (background: on a thread, from clones taken before save() returns).
//   3. commit (collective; in wait() when background): ranks send their piece records to rank 0,
//      which checks that the pieces of every tensor cover it exactly once, writes metadata.pb,
//      fsyncs it and the directory, renames step_N.tmp to step_N (swapping atomically with an
//      existing complete step_N, which is replaced only once the new one is complete), fsyncs
//      checkpoints/, replaces `latest` atomically, then applies retention. Rank 0 broadcasts
//      the outcome, so every rank returns or throws the same error, and none races ahead.
// Any write error is a std::runtime_error naming the path and strerror on every rank; step_N.tmp
// is removed best-effort and the previous checkpoint and `latest` stay as they were.
// Crash tests: SaveOptions::fault (after_shard | after_metadata | after_rename; modtrain sets it
// from MOD_CHECKPOINT_FAULT, train/test_hooks.h) makes the writer raise(SIGKILL) at that point
// (after_rename: step_N complete, `latest` not yet moved).
// Only the thread that calls save() and wait() uses the communicator.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "parallel/communicator.h"
#include "train/checkpoint/checkpoint.h"

namespace mod::ckpt {

// Where a save may be made to kill its own process (crash tests only).
enum class FaultPoint { None, AfterShard, AfterMetadata, AfterRename };
// "after_shard" -> AfterShard, ...; None for any other text.
FaultPoint parse_fault_point(const std::string& name);

struct SaveOptions {
  bool background = false;  // write shard files on a thread; wait() commits
  int keep_last = 0;        // newest checkpoints kept; 0 keeps all
  int keep_every = 0;       // steps divisible by this are kept forever; 0: none
  FaultPoint fault = FaultPoint::None;  // crash tests: raise(SIGKILL) there
};
SaveOptions save_options(const modtrain::CheckpointConfig& cfg);

class Checkpointer {
 public:
  // run_dir is shared by every rank (one file system); comm is the world communicator.
  Checkpointer(std::string run_dir, parallel::Communicator& comm);
  // Joins a background writer; an uncommitted save stays a .tmp that the next save removes.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Saves state.step. Foreground: returns once `latest` names it. Background:
  // returns once this rank's tensors are cloned and its shard write started. A save still
  // pending from before is committed first.
  void save(const std::vector<TensorEntry>& entries, const TrainState& state,
            const SaveOptions& options = {});
  // Collective when a save is pending (every rank then has one), a no-op otherwise: finishes
  // this rank's shard write and commits. Throws the save's error. Call at a step boundary and
  // before exit.
  void wait();
  bool pending() const { return pending_ != nullptr; }
  // The directory of the last checkpoint this object committed.
  const std::optional<std::string>& last_committed() const { return last_committed_; }

 private:
  struct Pending;
  void commit();

  std::string run_dir_;
  parallel::Communicator& comm_;
  std::unique_ptr<Pending> pending_;
  std::optional<std::string> last_committed_;
};

}  // namespace mod::ckpt
