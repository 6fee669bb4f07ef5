// Import of a Hugging Face Llama directory (see import.h).
#include "train/hf/import.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "core/util/file_io.h"
#include "core/util/safetensors.h"
#include "model/parameter_shapes.h"
#include "train/hf/llama.h"

namespace mod::hf {

namespace fs = std::filesystem;

bool is_hf_dir(const std::string& path) {
  return fs::is_directory(path) && fs::exists(path + "/config.json");
}

namespace {
nlohmann::json read_json(const std::string& path) {
  const std::string text = util::read_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(path + ": not valid JSON (" + e.what() + ")");
  }
}

// The safetensors files of dir: the shards model.safetensors.index.json lists, or
// model.safetensors alone.
std::vector<std::string> weight_files(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (!fs::exists(index)) {
    const std::string single = dir + "/model.safetensors";
    if (!fs::exists(single))
      throw std::invalid_argument(dir + ": neither model.safetensors nor "
                                  "model.safetensors.index.json (the weights of config.json)");
    return {single};
  }
  const nlohmann::json j = read_json(index);
  const auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object() || map->empty())
    throw std::invalid_argument(index + ": weight_map must be a non-empty object {tensor: file}");
  std::set<std::string> files;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string())
      throw std::invalid_argument(index + ": weight_map." + tensor + " must be a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw std::invalid_argument(index + ": weight_map." + tensor + " is \"" + f +
                                  "\", not a file name in " + dir);
    if (!fs::exists(dir + "/" + f))
      throw std::invalid_argument(index + ": weight_map." + tensor + " names " + f +
                                  ", which is missing from " + dir);
    files.insert(f);
  }
  std::vector<std::string> out;
  for (const std::string& f : files) out.push_back(dir + "/" + f);
  return out;
}
}  // namespace

bool is_modtrain_dir(const std::string& dir) {
  const nlohmann::json j = read_json(dir + "/config.json");
  return j.is_object() && j.value("model_type", std::string()) == "modtrain";
}

std::map<std::string, Tensor> read_llama(const std::string& dir_in, const modtrain::ModelConfig& cfg) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string config_path = dir + "/config.json";
  check_llama_config(read_json(config_path), config_path, cfg);

  // What the model needs, by HF name (the tied lm_head reads embed_tokens).
  std::map<std::string, std::pair<std::string, Shape>> wanted;  // hf name -> (modtrain name, shape)
  for (const auto& [name, shape] : model::parameter_shapes(cfg))
    if (const auto hf = llama_name(name)) wanted.emplace(*hf, std::make_pair(name, shape));

  std::map<std::string, Tensor> out;
  std::map<std::string, std::string> seen;  // hf name -> file that held it
  for (const std::string& file : weight_files(dir)) {
    SafetensorsFile f = load_safetensors(file);
    for (auto& [hf_name, t] : f.tensors) {
      if (const auto prev = seen.find(hf_name); prev != seen.end())
        throw std::invalid_argument(file + ": tensor " + hf_name + " is also in " + prev->second);
      seen.emplace(hf_name, file);
      if (hf_name.find("rotary_emb.inv_freq") != std::string::npos) continue;  // a cache
      const auto w = wanted.find(hf_name);
      if (w == wanted.end()) {
        // A tied model's file may still hold lm_head.weight (a copy of embed_tokens).
        if (hf_name == "lm_head.weight" && cfg.tie_embeddings()) continue;
        throw std::invalid_argument(file + ": tensor " + hf_name +
                                    " has no place in this LlamaForCausalLM (config.json " +
                                    "disagrees with the weights?)");
      }
      if (t.shape() != w->second.second)
        throw std::invalid_argument(file + ": tensor " + hf_name + " has shape " +
                                    shape_str(t.shape()) + " but config.json makes it " +
                                    shape_str(w->second.second));
      if (t.dtype() != DType::F32 && t.dtype() != DType::BF16)
        throw std::invalid_argument(file + ": tensor " + hf_name + " is " + dtype_name(t.dtype()) +
                                    " (expected F32 or BF16)");
      out.emplace(w->second.first, t.dtype() == DType::F32 ? std::move(t) : t.to(DType::F32));
    }
  }
  for (const auto& [hf_name, w] : wanted)
    if (!out.count(w.first))
      throw std::invalid_argument(dir + ": tensor " + hf_name + " (for " + w.first +
                                  ") is in none of the weight files");
  return out;
}

}  // namespace mod::hf
