// The safetensors header, parsed and checked without allocating tensors: every entry's dtype,
// shape and byte range are checked against the file size before a reader allocates anything, so
// a 10 GB header length or a 2^60-element shape is an error naming the file, never an allocation.
// As in the reference library, the tensors must tile the data section exactly (in offset order,
// each from where the previous ends, the last to the end of the file). The weights seal is
// checked here too: a sealed file seals every tensor and nothing else.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace mod {

// The weights seal (docs/checkpoints.md): metadata "crc32c.<name>" holds the CRC-32C of tensor
// <name>'s data bytes as 8 lowercase hex digits (crc32c_text), one key per tensor.
inline constexpr const char* kSealKeyPrefix = "crc32c.";

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;     // data_offsets, from the start of the data section
  std::optional<uint32_t> crc32c;  // its seal; absent in an unsealed file
};

struct SafetensorsIndex {
  std::vector<SafetensorsEntry> tensors;  // in header order
  std::map<std::string, std::string> metadata;  // without the seal's keys
  bool sealed = false;                          // every tensor has its seal
  uint64_t data_start = 0;  // 8 + header length
};

// Unless e's end - begin bytes at data have the CRC-32C its seal holds: an error naming the file,
// the tensor and both CRCs. An unsealed entry passes.
void check_safetensors_seal(const SafetensorsEntry& e, const void* data, const std::string& path);

// The header length from the first 8 bytes, checked against file_bytes; errors name path.
uint64_t safetensors_header_length(const unsigned char first8[8], uint64_t file_bytes,
                                   const std::string& path);

// Parses the JSON header of a file of file_bytes bytes whose header is header_json. Errors
// (std::runtime_error) name the file and the tensor or field.
SafetensorsIndex parse_safetensors_header(const std::string& header_json, uint64_t file_bytes,
                                          const std::string& path);

// The checked index of the file at path, read from its first 8 bytes and its header alone.
SafetensorsIndex read_safetensors_index(const std::string& path);

}  // namespace mod
