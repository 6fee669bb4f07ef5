// The weights file that train writes and eval/sample read (until checkpoints carry more):
// model.safetensors with every parameter by name and metadata {format: modtrain-weights-1,
// config: the RunConfig in text format, step: N, and tokenizer_crc32c: the dataset tokenizer's
// seal (train/data/tokenizer_seal.h) when it has one}, and the weights seal (each tensor's CRC-32C,
// core/util/safetensors.h). Loading checks every name, shape and seal.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "configs/modtrain.pb.h"
#include "model/transformer.h"
#include "train/weights_header.h"

namespace mod::train {

// The metadata save_weights writes (and a checkpoint export writes the same).
std::map<std::string, std::string> weights_metadata(const modtrain::RunConfig& cfg, int64_t step,
                                                    std::optional<uint32_t> tokenizer_crc32c);

void save_weights(const std::string& path, const model::Transformer& model,
                  const modtrain::RunConfig& cfg, int64_t step,
                  std::optional<uint32_t> tokenizer_crc32c = std::nullopt);
// The same file from named full tensors (a tensor-parallel model's gathered parameters).
void save_weights(const std::string& path,
                  const std::vector<std::pair<std::string, Tensor>>& params,
                  const modtrain::RunConfig& cfg, int64_t step,
                  std::optional<uint32_t> tokenizer_crc32c = std::nullopt);

struct LoadedModel {
  modtrain::RunConfig config;
  std::unique_ptr<model::Transformer> model;
  int64_t step = 0;
  std::string source;  // "weights <file>" or "checkpoint <metadata.pb>", for errors
  std::optional<uint32_t> tokenizer_crc32c;  // the seal of the tokenizer it was trained with
};
// What a load checks beyond names and shapes: every value finite, unless allowed (a damaged or
// diverged model opened on purpose, e.g. `modtrain eval --allow-non-finite` to look at it).
struct LoadChecks {
  bool allow_non_finite = false;
};

// Checks the header (train/weights_header.h) before the model is built, then every tensor.
LoadedModel load_weights(const std::string& path, const LoadChecks& checks = {});

// What eval, sample and inspect take: a weights file; a checkpoint directory; or a run
// directory, meaning the newer of its model.safetensors and its latest checkpoint (by step; the
// weights file on a tie). Errors say which of the three was expected.
LoadedModel load_model(const std::string& path, const LoadChecks& checks = {});

// Copies tensors into the model's parameters; every parameter must be present with its shape.
void assign_parameters(model::Transformer& model, const std::string& path);

}  // namespace mod::train
