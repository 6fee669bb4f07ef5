// Weights file (see weights.h).
#include "train/weights.h"

#include <filesystem>
#include <fstream>
#include <regex>
#include <stdexcept>

#include "configs/config.h"
#include "core/util/safetensors.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/metadata.h"
#include "train/checkpoint/reader.h"
#include "train/data/tokenizer_seal.h"

namespace mod::train {

std::map<std::string, std::string> weights_metadata(const modtrain::RunConfig& cfg, int64_t step,
                                                    std::optional<uint32_t> tokenizer_crc32c) {
  std::map<std::string, std::string> m = {{"format", "modtrain-weights-1"},
                                          {"config", config::to_text(cfg)},
                                          {"step", std::to_string(step)}};
  if (tokenizer_crc32c) m["tokenizer_crc32c"] = data::seal_text(*tokenizer_crc32c);
  return m;
}

void save_weights(const std::string& path, const model::Transformer& model,
                  const modtrain::RunConfig& cfg, int64_t step,
                  std::optional<uint32_t> tokenizer_crc32c) {
  save_weights(path, model.named_parameters(), cfg, step, tokenizer_crc32c);
}

void save_weights(const std::string& path,
                  const std::vector<std::pair<std::string, Tensor>>& params,
                  const modtrain::RunConfig& cfg, int64_t step,
                  std::optional<uint32_t> tokenizer_crc32c) {
  save_safetensors(path, params, weights_metadata(cfg, step, tokenizer_crc32c));
}

namespace {
void copy_into(model::Transformer& model, const SafetensorsFile& file, const std::string& path) {
  for (auto& [name, param] : model.named_parameters()) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end())
      throw std::runtime_error("weights " + path + ": missing tensor " + name);
    if (it->second.shape() != param.shape())
      throw std::runtime_error("weights " + path + ": tensor " + name + " has shape " +
                               shape_str(it->second.shape()) + ", the model expects " +
                               shape_str(param.shape()));
    Tensor p = param;
    p.copy_from(it->second.to(param.dtype()));
  }
  if (file.tensors.size() != model.named_parameters().size())
    throw std::runtime_error("weights " + path + ": " + std::to_string(file.tensors.size()) +
                             " tensors, the model has " +
                             std::to_string(model.named_parameters().size()) + " parameters");
}
}  // namespace

void assign_parameters(model::Transformer& model, const std::string& path) {
  copy_into(model, load_safetensors(path), path);
}

LoadedModel load_weights(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  if (file.metadata["format"] != "modtrain-weights-1")
    throw std::runtime_error("weights " + path +
                             ": not a modtrain weights file (metadata format '" +
                             file.metadata["format"] + "')");
  LoadedModel out;
  // The embedded config goes through the same checks as a config file: it sizes the model.
  out.config = config::parse_checked(file.metadata["config"], path + " (metadata config)");
  const std::string& step = file.metadata["step"];
  size_t used = 0;
  try {
    out.step = std::stoll(step, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != step.size() || out.step < 0)
    throw std::runtime_error("weights " + path + ": metadata step '" + step +
                             "' is not a step number");
  out.source = "weights " + path;
  if (file.metadata.count("tokenizer_crc32c"))
    out.tokenizer_crc32c = data::parse_seal_text(file.metadata["tokenizer_crc32c"],
                                                 "weights " + path + ": metadata tokenizer_crc32c");
  out.model = std::make_unique<model::Transformer>(out.config.model(), out.config.train().seed());
  copy_into(*out.model, file, path);
  return out;
}

int64_t weights_step(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return -1;
  unsigned char len_bytes[8];
  if (!in.read(reinterpret_cast<char*>(len_bytes), 8)) return -1;
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = len << 8 | len_bytes[i];  // little-endian
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec || len == 0 || file_bytes < 8 || len > file_bytes - 8) return -1;  // before allocating
  std::string header(len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(len))) return -1;
  // Metadata values are JSON strings: "format":"modtrain-weights-1", "step":"N".
  static const std::regex format_re("\"format\"\\s*:\\s*\"modtrain-weights-1\"");
  static const std::regex step_re("\"step\"\\s*:\\s*\"([0-9]+)\"");
  std::smatch m;
  if (!std::regex_search(header, format_re) || !std::regex_search(header, m, step_re)) return -1;
  if (m[1].length() > 18) return -1;  // beyond int64
  return std::stoll(m[1].str());
}

namespace {
LoadedModel load_checkpoint_model(const ckpt::CheckpointReader& reader) {
  LoadedModel out;
  out.config = reader.state().config;
  out.step = reader.state().step;
  out.source = "checkpoint " + reader.metadata_path();
  out.tokenizer_crc32c = reader.state().tokenizer_crc32c;
  out.model = std::make_unique<model::Transformer>(out.config.model(), out.config.train().seed());
  for (auto& [name, param] : out.model->named_parameters()) {
    const std::string key = "model/" + name;
    if (!reader.has(key))
      throw std::runtime_error("checkpoint " + reader.metadata_path() + ": missing tensor " + key);
    Tensor p = param;
    p.copy_from(reader.read(key, param.shape(), -1, 0, param.dtype()));
  }
  return out;
}
}  // namespace

LoadedModel load_model(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return load_weights(path);
  const std::string weights = path + "/model.safetensors";
  const bool has_weights = fs::is_regular_file(weights);
  const bool has_checkpoint = fs::exists(path + "/" + ckpt::kMetadataFile) ||
                              fs::exists(ckpt::checkpoints_dir(path) + "/latest");
  if (!has_weights && !has_checkpoint)
    throw std::runtime_error(path + ": neither a weights file, a checkpoint directory (no " +
                             std::string(ckpt::kMetadataFile) + ") nor a run directory (no " +
                             "model.safetensors, no checkpoints/latest)");
  if (!has_checkpoint) return load_weights(weights);
  const ckpt::CheckpointReader reader(ckpt::resolve_checkpoint(path));
  if (has_weights && weights_step(weights) >= reader.state().step) return load_weights(weights);
  return load_checkpoint_model(reader);
}

}  // namespace mod::train
