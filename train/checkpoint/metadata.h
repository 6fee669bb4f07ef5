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

// Sets meta_crc32c over the serialized message without it; returns the bytes to write.
std::string seal_meta(modtrain::ckpt::CheckpointMeta& meta);
// metadata.pb's bytes to a checked CheckpointMeta: parses, checks the format version, the
// checksum (absent only in checkpoints older than it: accepted, see docs/fuzzing.md), the config
// (config::validate, as a config file gets) and the index. Errors name `where`.
modtrain::ckpt::CheckpointMeta open_meta(const std::string& bytes, const std::string& where);

// The 64-byte header of a shard file of file_bytes bytes: magic, format version, zeros.
void check_shard_header(const unsigned char header[64], uint64_t file_bytes, const std::string& where);
// A piece's byte range inside a file of file_bytes bytes and its length against its shape and
// dtype, before anything is allocated for it.
void check_piece_range(const modtrain::ckpt::Piece& piece, DType dtype, uint64_t file_bytes,
                       const std::string& where);

// Throws std::runtime_error "<where>: tensor <name>: <problem>" for the first problem found.
void validate_index(const modtrain::ckpt::CheckpointMeta& meta, const std::string& where);

}  // namespace mod::ckpt
