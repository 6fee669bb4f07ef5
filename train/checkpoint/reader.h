// Reading a checkpoint, at any sharding. CheckpointReader parses and checks metadata.pb once;
// read() assembles a requested slab of a tensor from whatever saved pieces overlap it, so a
// checkpoint saved at tp=2 reads back at tp=1 (two pieces) and one saved at tp=1 reads back at
// tp=2 (half of one piece). Every piece touched is checked (byte range inside its file, CRC-32C)
// and every error names the file and the tensor:
//   checkpoint runs/x/checkpoints/step_00000010/shard_1.bin: tensor model/wte.weight: CRC32C
//   mismatch (stored 0x1234abcd, computed 0x0badf00d)
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "train/checkpoint/checkpoint.h"

namespace mod::ckpt {

// The first field where two model sections differ, as "model.d_model: 64 in the checkpoint,
// 128 now"; nullopt when they are equal (defaults count as set).
std::optional<std::string> model_difference(const modtrain::ModelConfig& saved,
                                            const modtrain::ModelConfig& current);

class CheckpointReader {
 public:
  // dir: a checkpoint directory (resolve_checkpoint() turns a run directory into one).
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  const std::string& metadata_path() const { return metadata_path_; }
  const TrainState& state() const { return state_; }

  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const;
  Shape global_shape(const std::string& name) const;
  DType dtype(const std::string& name) const;

  // The slab [offset, offset + local_shape[shard_dim]) along shard_dim of tensor `name`
  // (shard_dim -1: the whole tensor, local_shape = the global shape), as a new CPU tensor of
  // `dtype` (f32 <-> f64 convert; other dtypes must match the saved one).
  Tensor read(const std::string& name, const Shape& local_shape, int shard_dim = -1,
              int64_t offset = 0, DType dtype = DType::F32) const;
  Tensor read_full(const std::string& name) const;  // whole, in its saved dtype

  // Throws naming metadata.pb and the first differing model field unless `current` has the
  // same model section (other sections, e.g. optimizer or parallel, may change on resume).
  void check_compatible(const modtrain::RunConfig& current) const;

 private:
  struct Index;
  std::string dir_, metadata_path_;
  TrainState state_;
  std::unique_ptr<Index> index_;
};

}  // namespace mod::ckpt
