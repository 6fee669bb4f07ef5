// safetensors files (the format of the Hugging Face safetensors library): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}},
// then the raw tensor bytes. modtrain writes F32/F64 tensors by their parameter names, and
// metadata strings (the model config); the file is written to a temporary name and renamed.
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

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  // CPU tensors
  std::map<std::string, std::string> metadata;
};
// Errors name the file and the tensor.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace mod
