// Checkpoints: what a save takes (tensor entries, the training state) and where it lands on disk.
// Layout (docs/checkpoints.md):
//   run_dir/checkpoints/step_00000010/metadata.pb   CheckpointMeta (checkpoint.proto)
//   run_dir/checkpoints/step_00000010/shard_<r>.bin one per writing rank, 64-byte-aligned blobs
//   run_dir/checkpoints/latest                      "step_00000010\n", replaced atomically last
// Invariant: a directory named step_N (no .tmp) is complete, and `latest` only ever names one.
// Writing: writer.h (Checkpointer). Reading and resharding: reader.h. Export: export.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/tensor.h"
#include "train/data/dataset.h"

namespace mod::ckpt {

constexpr int kFormatVersion = 1;

// One tensor, or this rank's slice of it, to save. With shard_dim = d >= 0, local is
// global[shard_offset : shard_offset + local.size(d)] along d; with -1, the whole tensor. One rank
// may pass several entries of one name (several slices); across all ranks the writer entries of
// a name must cover it exactly once, which the save checks.
struct TensorEntry {
  std::string name;  // "model/blocks.0.attn.wq.weight", "optim/m/<param>", "optim/v/<param>"
  Tensor local;      // CPU, contiguous
  Shape global_shape;
  int shard_dim = -1;  // -1: local is the whole tensor
  int64_t shard_offset = 0;
  bool writer = true;  // false: a replica that another rank writes (e.g. data-parallel ranks > 0)
};

// The device mesh a checkpoint was saved under (informational: any layout can read it).
struct MeshLayout {
  int dp = 1;          // data-parallel degree, e.g. 2
  int tp = 1;          // tensor-parallel degree, e.g. 2
  int zero_stage = 0;  // parallel.zero_stage (0: nothing sharded over dp)
  int world_size = 1;  // ranks in the save, e.g. 4 (= dp x tp x pp)
  int pp = 1;          // pipeline stages, e.g. 2
};

// Everything besides tensors that a resume restores. Rank 0's copy is the one saved.
struct TrainState {
  modtrain::RunConfig config;
  int64_t step = 0;  // optimizer steps completed; names the directory
  int64_t tokens_seen = 0;
  uint64_t loader_seed = 0;         // data::LoaderState::seed
  int64_t batches_drawn = 0;        // data::LoaderState::batches_drawn
  std::vector<data::ShardFingerprint> data_shards;  // the training shards (may be empty: older)
  std::vector<uint64_t> rng_state;  // Rng::state() words
  MeshLayout mesh;
  double elapsed_seconds = 0;     // wall time trained so far, over every resume
  int64_t last_metrics_step = 0;  // last step written to metrics.csv / TensorBoard
  int64_t optimizer_steps = 0;    // AdamW::steps_taken()
  std::optional<uint32_t> tokenizer_crc32c;  // the dataset's tokenizer seal, if it has one
};

// --- layout ---
std::string checkpoints_dir(const std::string& run_dir);  // run_dir/checkpoints
std::string step_dir_name(int64_t step);                  // "step_00000010"
// The step of a complete checkpoint directory name ("step_00000010" -> 10); nullopt for
// anything else, ".tmp" directories included.
std::optional<int64_t> parse_step_dir_name(const std::string& name);
// Complete checkpoints under run_dir/checkpoints as (step, directory), by step ascending.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

// The checkpoint directory `latest` names, after checking its metadata.pb is there and parses.
// nullopt when no checkpoint was ever committed (no `latest`); an error naming the file when
// `latest` exists but names something missing or unreadable (never silently start over).
std::optional<std::string> find_latest(const std::string& run_dir);

// A checkpoint directory (has metadata.pb) as is, or a run directory's latest checkpoint;
// otherwise an error that says which of the two was expected.
std::string resolve_checkpoint(const std::string& path);

}  // namespace mod::ckpt
