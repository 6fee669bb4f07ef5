// Export to a Hugging Face directory (see export.h).
#include "train/hf/export.h"

#include <cctype>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/util/file_io.h"
#include "core/util/safetensors.h"
#include "train/data/dataset.h"
#include "train/data/tokenizer_seal.h"
#include "model/routing_schedule.h"
#include "train/hf/llama.h"
#include "train/hf/modeling_sources.h"
#include "train/hf/tokenizer_json.h"
#include "train/weights.h"

namespace mod::hf {

namespace fs = std::filesystem;

const char* const kTempSuffix = ".hf-export.tmp";

bool is_export_file(const std::string& name) {
  static const std::set<std::string> names = {
      "config.json",    "model.safetensors",     "generation_config.json",  "tokenizer.json",
      "tokenizer_config.json", "configuration_modtrain.py", "modeling_modtrain.py"};
  return names.count(name) > 0;
}

namespace {
using ojson = nlohmann::ordered_json;

struct TokenizerFiles {
  std::string kind, json;
  std::optional<uint32_t> eot;
  std::optional<std::string> eot_text;
};

TokenizerFiles tokenizer_files(const train::LoadedModel& loaded, const std::string& path) {
  const std::string dir = loaded.config.data().dir();
  data::SealedTokenizer t =
      path.empty() ? data::load_dataset_tokenizer(dir) : data::load_sealed_tokenizer(path);
  data::check_tokenizer_seal(t.path, t.crc32c, loaded.source, loaded.tokenizer_crc32c);
  const auto vocab = static_cast<uint32_t>(loaded.config.model().vocab_size());
  if (t.tokenizer->vocab_size() != vocab)
    throw std::invalid_argument("tokenizer " + t.path + ": vocabulary " +
                                std::to_string(t.tokenizer->vocab_size()) + " but the model has " +
                                std::to_string(vocab));
  TokenizerFiles out;
  out.kind = t.tokenizer->kind();
  out.json = out.kind == "hf" ? data::read_tokenizer_file(t.path) : own_tokenizer_json(*t.tokenizer);
  if (path.empty()) {
    const auto m = data::read_manifest(dir + "/" + data::kManifestName);
    if (m.has_eot_token()) out.eot = m.eot_token();
  } else {
    out.eot = t.tokenizer->special_token("<|endoftext|>");
  }
  if (out.eot) {
    const std::string text = t.tokenizer->decode({*out.eot});
    if (t.tokenizer->special_token(text) == out.eot) out.eot_text = text;
  }
  return out;
}

// An error unless out_dir is absent, or a directory holding only files an export writes.
void check_replaceable(const std::string& out_dir) {
  if (!fs::exists(out_dir)) return;
  if (!fs::is_directory(out_dir))
    throw std::invalid_argument("--out " + out_dir + ": exists and is not a directory");
  for (const auto& e : fs::directory_iterator(out_dir))
    if (!e.is_regular_file() || !is_export_file(e.path().filename().string()))
      throw std::invalid_argument("--out " + out_dir + ": holds " + e.path().filename().string() +
                                  ", which an hf export does not write; not replacing it");
}

void write_json(const std::string& path, const ojson& j) { util::write_file(path, j.dump(2) + "\n"); }

// An enum's name as config.json spells it: GELU -> "gelu", AUX_BCE -> "aux_bce".
std::string lower(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// config.json for modeling_modtrain.py: ModtrainConfig's fields, the MoD and MoE schedules
// expanded into block lists.
ojson modtrain_config_json(const modtrain::ModelConfig& cfg, std::optional<uint32_t> eos) {
  ojson routed = ojson::array(), capacity = ojson::array(), moe = ojson::array();
  if (cfg.mod().enabled()) {
    const auto is_routed = model::routed_blocks(cfg);
    const auto fractions = model::capacity_fractions(cfg);
    for (size_t b = 0; b < is_routed.size(); ++b)
      if (is_routed[b]) {
        routed.push_back(b);
        capacity.push_back(fractions[b]);
      }
  }
  const auto is_moe = model::moe_blocks(cfg);
  for (size_t b = 0; b < is_moe.size(); ++b)
    if (is_moe[b]) moe.push_back(b);
  const modtrain::MoEConfig& e = cfg.moe();
  return {
      {"architectures", {"ModtrainForCausalLM"}},
      {"model_type", "modtrain"},
      {"auto_map",
       {{"AutoConfig", "configuration_modtrain.ModtrainConfig"},
        {"AutoModelForCausalLM", "modeling_modtrain.ModtrainForCausalLM"}}},
      {"vocab_size", cfg.vocab_size()},
      {"hidden_size", cfg.d_model()},
      {"num_hidden_layers", cfg.n_layers()},
      {"num_attention_heads", cfg.n_heads()},
      {"intermediate_size", cfg.d_ff()},
      {"max_position_embeddings", cfg.seq_len()},
      {"mlp", lower(modtrain::ModelConfig::Mlp_Name(cfg.mlp()))},
      {"norm", cfg.norm() == modtrain::ModelConfig::LAYER ? "layer" : "rms"},
      {"norm_eps", cfg.norm_eps()},
      {"rope_theta", cfg.rope_theta()},
      {"tie_word_embeddings", cfg.tie_embeddings()},
      {"mod_routed_blocks", routed},
      {"mod_capacity", capacity},
      {"mod_gate", lower(modtrain::RouterConfig::Gate_Name(cfg.mod().router().gate()))},
      {"mod_router_bias", cfg.mod().router().bias()},
      {"mod_causal",
       lower(modtrain::CausalRoutingConfig::Method_Name(cfg.mod().causal().method()))},
      {"mod_predictor_hidden", cfg.mod().causal().predictor_hidden()},
      {"moe_blocks", moe},
      {"moe_n_experts", e.n_experts()},
      {"moe_d_expert", e.d_expert()},
      {"moe_routing", lower(modtrain::MoEConfig::Routing_Name(e.routing()))},
      {"moe_capacity_factor", e.capacity_factor()},
      {"moe_top_k", e.top_k()},
      {"moe_noop_expert", e.noop_expert()},
      {"moe_noop_capacity", e.noop_capacity()},
      {"moe_router_bias", e.router_bias()},
      {"routing", "top_c"},
      {"bos_token_id", nullptr},
      {"eos_token_id", eos ? ojson(*eos) : ojson(nullptr)},
      {"pad_token_id", nullptr},
      {"use_cache", false},
      {"torch_dtype", "float32"},
      {"dtype", "float32"},
  };
}
}  // namespace

ExportSummary export_hf(const ExportOptions& o) {
  std::string out_dir = o.out_dir;
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  if (out_dir.empty()) throw std::invalid_argument("--out: empty directory name");
  check_replaceable(out_dir);

  const train::LoadedModel loaded = train::load_model(o.from);
  const modtrain::ModelConfig& cfg = loaded.config.model();
  // Llama when it can express the model (no MoE, no MoD); else modtrain's own modeling code.
  const bool llama = llama_incompatibility(cfg).empty() && !cfg.mod().enabled();
  const TokenizerFiles tok = tokenizer_files(loaded, o.tokenizer);

  ExportSummary s{loaded.source, loaded.step, 0, 0,
                  llama ? "LlamaForCausalLM" : "ModtrainForCausalLM", tok.kind};
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : loaded.model->named_parameters()) {
    const auto hf_name = llama ? llama_name(name) : std::optional<std::string>(name);
    if (!hf_name)  // llama_incompatibility() (MoE) and the MoD check leave none
      throw std::logic_error("hf export: parameter " + name + " has no Llama name");
    Tensor t = p.to(Device::CPU).to(DType::F32);
    ++s.tensors;
    s.bytes += static_cast<int64_t>(t.nbytes());
    tensors.emplace_back(*hf_name, std::move(t));
  }

  ojson config = llama ? llama_config_json(cfg, tok.eot) : modtrain_config_json(cfg, tok.eot);
  ojson generation = {{"bos_token_id", nullptr},
                      {"eos_token_id", tok.eot ? ojson(*tok.eot) : ojson(nullptr)},
                      {"pad_token_id", nullptr},
                      {"do_sample", false},
                      {"use_cache", llama}};
  ojson tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                      {"model_max_length", cfg.seq_len()},
                      {"add_bos_token", false},
                      {"add_eos_token", false},
                      {"clean_up_tokenization_spaces", false}};
  if (tok.eot_text) tok_config["eos_token"] = *tok.eot_text;

  // Written whole to a sibling temp directory (a leftover of a crashed export is replaced), then
  // renamed over out_dir.
  const std::string tmp = out_dir + kTempSuffix;
  fs::remove_all(tmp);
  util::make_dir(tmp);
  try {  // a failed write (a full disk) leaves no temp directory behind
    save_safetensors(tmp + "/model.safetensors", tensors, {{"format", "pt"}});
    write_json(tmp + "/config.json", config);
    write_json(tmp + "/generation_config.json", generation);
    util::write_file(tmp + "/tokenizer.json", tok.json);
    write_json(tmp + "/tokenizer_config.json", tok_config);
    if (!llama) {
      util::write_file(tmp + "/configuration_modtrain.py", kConfigurationModtrainPy);
      util::write_file(tmp + "/modeling_modtrain.py", kModelingModtrainPy);
    }
    util::fsync_dir(tmp);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  if (fs::exists(out_dir)) {
    if (!util::exchange_paths(tmp, out_dir)) {
      fs::remove_all(out_dir);
      util::rename_path(tmp, out_dir);
    }
    fs::remove_all(tmp);
  } else {
    util::rename_path(tmp, out_dir);
  }
  util::fsync_dir(util::parent_dir(out_dir));
  return s;
}

}  // namespace mod::hf
