// Checkpoint -> safetensors: every "model/<param>" tensor, whole (however it was sharded), named
// <param> like the model's parameters, with the metadata train::save_weights writes
// (train::weights_metadata: format, config, step, the tokenizer's seal) and the weights seal,
// so `modtrain eval`, `modtrain sample` (train::load_weights) and the Python
// safetensors package read the file.
#pragma once

#include <string>

namespace mod::ckpt {

struct ExportSummary {
  std::string checkpoint;  // the checkpoint directory read
  int64_t step = 0;
  int64_t tensors = 0, bytes = 0;
};

// `from`: a checkpoint directory or a run directory (its latest checkpoint).
ExportSummary export_safetensors(const std::string& from, const std::string& out_path);

}  // namespace mod::ckpt
