// Shard files (shard_<rank>.bin): a 64-byte header (magic "MODSHARD", format version, rank,
// piece count, zeros) then each piece's raw bytes at a 64-byte-aligned offset. The file carries
// no index: metadata.pb records each piece's byte range and CRC-32C, and reading a piece checks
// both, so a flipped byte or a truncated file is an error naming the file and the tensor.
#pragma once

#include <string>
#include <vector>

#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/checkpoint.pb.h"

namespace mod::ckpt {

constexpr size_t kShardAlign = 64;

std::string shard_file_name(int rank);  // "shard_3.bin"

// Writes the entries (CPU, contiguous) to path and fsyncs it; returns one TensorInfo per entry
// with its single piece filled in (file = the base name of path).
modtrain::ckpt::RankPieces write_shard_file(const std::string& path, int rank,
                                            const std::vector<TensorEntry>& entries);

// The piece's bytes from dir/piece.file as a tensor of its local shape, after checking the
// header, the byte range against the file size and the CRC-32C.
Tensor read_piece(const std::string& dir, const std::string& tensor_name, DType dtype,
                  const modtrain::ckpt::Piece& piece);

}  // namespace mod::ckpt
