// Weights file (see weights.h).
#include "train/weights.h"

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "configs/config.h"
#include "core/util/crc32c.h"
#include "core/util/safetensors.h"
#include "model/parameter_shapes.h"
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
  if (tokenizer_crc32c) m["tokenizer_crc32c"] = crc32c_text(*tokenizer_crc32c);
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

namespace {
// The first non-finite value of any parameter is an error naming the source, the tensor, the
// element and the way to open the file anyway.
void check_finite(const LoadedModel& m, const LoadChecks& checks) {
  if (checks.allow_non_finite) return;
  for (const auto& [name, p] : m.model->named_parameters()) {
    Tensor host = p.device() == Device::CPU ? p : p.to(Device::CPU);
    if (host.dtype() != DType::F32 && host.dtype() != DType::F64) host = host.to(DType::F32);
    const int64_t n = host.numel();
    auto value = [&](int64_t i) {  // one pass over the storage, no copy of the model
      return host.dtype() == DType::F32 ? static_cast<double>(host.data<float>()[i])
                                         : host.data<double>()[i];
    };
    for (int64_t i = 0; i < n; ++i) {
      const double x = value(i);
      if (std::isfinite(x)) continue;
      std::string index;
      int64_t rest = i;
      for (int d = p.dim() - 1; d >= 0; --d) {
        index = std::to_string(rest % p.size(d)) + (index.empty() ? "" : ", ") + index;
        rest /= p.size(d);
      }
      throw std::runtime_error(m.source + ": tensor " + name + " holds " +
                               (std::isnan(x) ? "NaN" : "an infinity") + " at [" + index +
                               "] (element " + std::to_string(i) + " of " + std::to_string(n) +
                               "); the weights are damaged or the run diverged "
                               "(--allow-non-finite opens them anyway)");
    }
  }
}
}  // namespace

LoadedModel load_weights(const std::string& path, const LoadChecks& checks) {
  // The header first (format, step, config, every tensor's shape): nothing is allocated for a
  // file that does not hold the model its config describes.
  const SafetensorsIndex index = read_safetensors_index(path);
  const WeightsHeader header = check_weights_header(index, path);
  LoadedModel out;
  out.config = header.config;
  out.step = header.step;
  out.source = "weights " + path;
  if (index.metadata.count("tokenizer_crc32c"))
    out.tokenizer_crc32c = parse_crc32c_text(index.metadata.at("tokenizer_crc32c"),
                                             "weights " + path + ": metadata tokenizer_crc32c");
  out.model = std::make_unique<model::Transformer>(out.config.model(), out.config.train().seed());
  copy_into(*out.model, load_safetensors(path), path);
  check_finite(out, checks);
  return out;
}

namespace {
// The index (checked with its embedded config when the reader opened it) must hold every
// parameter with its shape before the model is built.
void check_checkpoint_shapes(const ckpt::CheckpointReader& reader) {
  for (const auto& [name, shape] : model::parameter_shapes(reader.state().config.model())) {
    const std::string key = "model/" + name;
    if (!reader.has(key))
      throw std::runtime_error("checkpoint " + reader.metadata_path() + ": missing tensor " + key);
    if (reader.global_shape(key) != shape)
      throw std::runtime_error("checkpoint " + reader.metadata_path() + ": tensor " + key +
                               " has shape " + shape_str(reader.global_shape(key)) +
                               ", the model expects " + shape_str(shape));
  }
}

LoadedModel load_checkpoint_model(const ckpt::CheckpointReader& reader) {
  check_checkpoint_shapes(reader);
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

LoadedModel load_model(const std::string& path, const LoadChecks& checks) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return load_weights(path, checks);
  const std::string weights = path + "/model.safetensors";
  const bool has_weights = fs::is_regular_file(weights);
  const bool has_checkpoint = fs::exists(path + "/" + ckpt::kMetadataFile) ||
                              fs::exists(ckpt::checkpoints_dir(path) + "/latest");
  if (!has_weights && !has_checkpoint)
    throw std::runtime_error(path + ": neither a weights file, a checkpoint directory (no " +
                             std::string(ckpt::kMetadataFile) + ") nor a run directory (no " +
                             "model.safetensors, no checkpoints/latest)");
  if (!has_checkpoint) return load_weights(weights, checks);
  const ckpt::CheckpointReader reader(ckpt::resolve_checkpoint(path));
  if (has_weights && weights_step(weights) >= reader.state().step)
    return load_weights(weights, checks);
  LoadedModel out = load_checkpoint_model(reader);
  check_finite(out, checks);
  return out;
}

}  // namespace mod::train
