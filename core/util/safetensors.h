// safetensors files (the format of the Hugging Face safetensors library): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw tensor bytes. modtrain writes F32/F64 tensors by their parameter names, and
// metadata strings (the model config); the file is written to a temporary name and renamed.
// Every file written is sealed: each tensor's CRC-32C in the metadata (safetensors_header.h).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mod {

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// metadata must not hold the seal's keys (kSealKeyPrefix).
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;  // without the seal's keys
};
// Errors name the file and the tensor; a tensor whose bytes do not match its seal is one. An
// unsealed file (another tool's) loads unchecked, with a note on stderr once per file.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace mod
