// Weights file header checks (see weights_header.h).
#include "train/weights_header.h"

#include <filesystem>
#include <map>
#include <stdexcept>

#include "configs/config.h"
#include "model/parameter_shapes.h"

namespace mod::train {

namespace {
std::string metadata(const SafetensorsIndex& index, const std::string& key) {
  const auto it = index.metadata.find(key);
  return it == index.metadata.end() ? "" : it->second;
}
}  // namespace

int64_t parse_weights_step(const std::string& text, const std::string& path) {
  // At most 18 digits: every such number fits int64 (stoll would throw on more).
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error("weights " + path + ": metadata step '" + text.substr(0, 40) +
                             (text.size() > 40 ? "...' (" + std::to_string(text.size()) + " bytes)" : "'") +
                             " is not a step number");
  return std::stoll(text);
}

WeightsHeader check_weights_header(const SafetensorsIndex& index, const std::string& path) {
  const std::string format = metadata(index, "format");
  if (format != kWeightsFormat)
    throw std::runtime_error("weights " + path + ": not a modtrain weights file (metadata format '" +
                             format.substr(0, 40) + "')");
  WeightsHeader out;
  // The embedded config goes through the same checks as a config file: it sizes the model.
  out.config = config::parse_checked(metadata(index, "config"), path + " (metadata config)");
  out.step = parse_weights_step(metadata(index, "step"), path);
  // Every tensor the model has, with its shape, and no other: checked before the model exists.
  std::map<std::string, const SafetensorsEntry*> by_name;
  for (const SafetensorsEntry& e : index.tensors) by_name[e.name] = &e;
  const auto expected = model::parameter_shapes(out.config.model());
  for (const auto& [name, shape] : expected) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw std::runtime_error("weights " + path + ": missing tensor " + name);
    if (it->second->shape != shape)
      throw std::runtime_error("weights " + path + ": tensor " + name + " has shape " +
                               shape_str(it->second->shape) + ", the model expects " +
                               shape_str(shape));
  }
  if (index.tensors.size() != expected.size())
    throw std::runtime_error("weights " + path + ": " + std::to_string(index.tensors.size()) +
                             " tensors, the model has " + std::to_string(expected.size()) +
                             " parameters");
  return out;
}

int64_t weights_step(const std::string& path) {
  try {
    if (!std::filesystem::is_regular_file(path)) return -1;
    const SafetensorsIndex index = read_safetensors_index(path);
    if (metadata(index, "format") != kWeightsFormat) return -1;
    return parse_weights_step(metadata(index, "step"), path);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace mod::train
