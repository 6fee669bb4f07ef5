// metadata.pb: TrainState to and from CheckpointMeta, merging the pieces every rank wrote into
// one tensor index, and the index check that writer and reader share: per tensor a known dtype,
// pieces inside the global shape with consistent byte lengths, no two pieces overlapping, and
// all of them together covering the tensor exactly.
#pragma once

#include <string>
#include <vector>

#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/checkpoint.pb.h"

namespace mod::ckpt {

constexpr const char* kMetadataFile = "metadata.pb";

DType parse_dtype(const std::string& name, const std::string& where);  // "f32" -> F32

// Groups pieces by tensor name (sorted); the same name must carry one dtype and global shape.
std::vector<modtrain::ckpt::TensorInfo> merge_pieces(
    const std::vector<modtrain::ckpt::RankPieces>& ranks);

modtrain::ckpt::CheckpointMeta make_meta(const TrainState& state,
                                         std::vector<modtrain::ckpt::TensorInfo> tensors);
TrainState state_from_meta(const modtrain::ckpt::CheckpointMeta& meta);

// Throws std::runtime_error "<where>: tensor <name>: <problem>" for the first problem found.
void validate_index(const modtrain::ckpt::CheckpointMeta& meta, const std::string& where);

}  // namespace mod::ckpt
