// modtrain <-> LlamaForCausalLM (see llama.h).
#include "train/hf/llama.h"

#include <charconv>
#include <map>
#include <stdexcept>

namespace mod::hf {

namespace {
// A block parameter's name after "blocks.N." -> after "model.layers.N.".
const std::map<std::string, std::string>& block_names() {
  static const std::map<std::string, std::string> names = {
      {"norm1.weight", "input_layernorm.weight"},
      {"attn.wq.weight", "self_attn.q_proj.weight"},
      {"attn.wk.weight", "self_attn.k_proj.weight"},
      {"attn.wv.weight", "self_attn.v_proj.weight"},
      {"attn.wo.weight", "self_attn.o_proj.weight"},
      {"norm2.weight", "post_attention_layernorm.weight"},
      {"mlp.gate.weight", "mlp.gate_proj.weight"},
      {"mlp.up.weight", "mlp.up_proj.weight"},
      {"mlp.down.weight", "mlp.down_proj.weight"},
  };
  return names;
}

// The shortest text that reads back as v ("1e-05", "500000").
std::string num(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

std::optional<std::string> llama_name(const std::string& name) {
  if (name == "embed.weight") return "model.embed_tokens.weight";
  if (name == "final_norm.weight") return "model.norm.weight";
  if (name == "lm_head.weight") return "lm_head.weight";
  const std::string prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const auto it = block_names().find(name.substr(dot + 1));
  if (it == block_names().end()) return std::nullopt;
  return "model.layers." + name.substr(prefix.size(), dot - prefix.size()) + "." + it->second;
}

std::string llama_incompatibility(const modtrain::ModelConfig& cfg) {
  if (cfg.mlp() != modtrain::ModelConfig::SWIGLU)
    return "model.mlp is " + modtrain::ModelConfig::Mlp_Name(cfg.mlp()) +
           " (Llama's MLP is SWIGLU)";
  if (cfg.norm() != modtrain::ModelConfig::RMS)
    return "model.norm is " + modtrain::ModelConfig::Norm_Name(cfg.norm()) +
           " (Llama's norm is RMS)";
  if (cfg.moe().enabled()) return "model.moe has experts (Llama has one dense MLP a block)";
  return "";
}

nlohmann::ordered_json llama_config_json(const modtrain::ModelConfig& cfg,
                                         std::optional<uint32_t> eos) {
  using ojson = nlohmann::ordered_json;
  const ojson eos_json = eos ? ojson(*eos) : ojson(nullptr);
  return {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", cfg.vocab_size()},
      {"hidden_size", cfg.d_model()},
      {"intermediate_size", cfg.d_ff()},
      {"num_hidden_layers", cfg.n_layers()},
      {"num_attention_heads", cfg.n_heads()},
      {"num_key_value_heads", cfg.n_heads()},
      {"head_dim", cfg.d_model() / cfg.n_heads()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", cfg.seq_len()},
      {"rms_norm_eps", cfg.norm_eps()},
      // rope_theta and rope_scaling for transformers 4.x, rope_parameters for 5.x.
      {"rope_theta", cfg.rope_theta()},
      {"rope_scaling", nullptr},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", cfg.rope_theta()}}},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"mlp_bias", false},
      {"pretraining_tp", 1},
      {"tie_word_embeddings", cfg.tie_embeddings()},
      {"initializer_range", cfg.init_std()},
      {"bos_token_id", nullptr},
      {"eos_token_id", eos_json},
      {"pad_token_id", nullptr},
      {"use_cache", true},
      {"torch_dtype", "float32"},
      {"dtype", "float32"},
  };
}

void check_llama_config(const nlohmann::json& j, const std::string& file,
                        const modtrain::ModelConfig& cfg) {
  auto fail = [&](const std::string& field, const std::string& msg) {
    throw std::invalid_argument(file + ": " + field + " " + msg);
  };
  if (!j.is_object()) throw std::invalid_argument(file + ": not a JSON object");
  const auto arch = j.find("architectures");
  const bool llama_arch = arch != j.end() && arch->is_array() && arch->size() == 1 &&
                          (*arch)[0] == "LlamaForCausalLM";
  if (!llama_arch)
    fail("architectures", (arch == j.end() ? std::string("is missing") : "is " + arch->dump()) +
                              ": only [\"LlamaForCausalLM\"] can be imported");
  if (j.value("model_type", std::string()) != "llama")
    fail("model_type", "is " + (j.contains("model_type") ? j["model_type"].dump() : "missing") +
                           ", expected \"llama\"");
  auto integer = [&](const char* key) -> int64_t {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) fail(key, "must be an integer");
    return it->get<int64_t>();
  };
  auto same = [&](const char* key, int64_t want, const char* field) {
    const int64_t got = integer(key);
    if (got != want)
      fail(key, "is " + std::to_string(got) + " but the run's " + field + " is " +
                    std::to_string(want) + " (--set " + field + "=" + std::to_string(got) + ")");
  };
  auto number = [&](const nlohmann::json& o, const char* key, const char* field) -> double {
    if (!o[key].is_number()) fail(field, "must be a number, not " + o[key].dump());
    return o[key].get<double>();
  };
  same("vocab_size", cfg.vocab_size(), "model.vocab_size");
  same("hidden_size", cfg.d_model(), "model.d_model");
  same("intermediate_size", cfg.d_ff(), "model.d_ff");
  same("num_hidden_layers", cfg.n_layers(), "model.n_layers");
  same("num_attention_heads", cfg.n_heads(), "model.n_heads");
  const int64_t heads = cfg.n_heads();
  const int64_t kv = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                         ? integer("num_key_value_heads")
                         : heads;
  if (kv != heads)
    fail("num_key_value_heads", "is " + std::to_string(kv) + " with " + std::to_string(heads) +
                                    " attention heads: grouped-query attention is not supported "
                                    "(modtrain has one K/V head per query head)");
  if (j.contains("head_dim") && !j["head_dim"].is_null() &&
      integer("head_dim") != cfg.d_model() / heads)
    fail("head_dim", "is " + j["head_dim"].dump() + ", modtrain's is d_model / n_heads = " +
                         std::to_string(cfg.d_model() / heads));
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (j.contains(key) && !j[key].is_null() && j[key] != false)
      fail(key, "is " + j[key].dump() + ": modtrain's attention and MLP have no biases");
  if (j.value("hidden_act", std::string("silu")) != "silu")
    fail("hidden_act", "is " + j["hidden_act"].dump() + ", expected \"silu\" (SwiGLU)");
  if (j.contains("pretraining_tp") && !j["pretraining_tp"].is_null() && j["pretraining_tp"] != 1)
    fail("pretraining_tp", "is " + j["pretraining_tp"].dump() + ", expected 1");
  // The rope: transformers 5 writes rope_parameters, 4.x rope_theta and rope_scaling.
  double theta = 10000.0;
  std::string theta_field = "rope_theta";
  if (const auto rp = j.find("rope_parameters"); rp != j.end() && !rp->is_null()) {
    if (!rp->is_object()) fail("rope_parameters", "must be an object");
    const std::string type = rp->value("rope_type", std::string("default"));
    if (type != "default")
      fail("rope_parameters.rope_type", "is \"" + type + "\": only the default rope is supported");
    if (rp->contains("rope_theta")) theta = number(*rp, "rope_theta", "rope_parameters.rope_theta");
    theta_field = "rope_parameters.rope_theta";
  } else if (j.contains("rope_theta") && !j["rope_theta"].is_null()) {
    theta = number(j, "rope_theta", "rope_theta");
  }
  if (const auto rs = j.find("rope_scaling"); rs != j.end() && !rs->is_null()) {
    const std::string type = rs->is_object() ? rs->value("rope_type", rs->value("type", std::string())) : "";
    if (type != "default")
      fail("rope_scaling", "is " + rs->dump() + ": rope scaling is not supported (null expected)");
  }
  if (theta != cfg.rope_theta())
    fail(theta_field, "is " + num(theta) + " but the run's model.rope_theta is " +
                          num(cfg.rope_theta()) + " (--set model.rope_theta=" + num(theta) + ")");
  const double eps = j.contains("rms_norm_eps") ? number(j, "rms_norm_eps", "rms_norm_eps") : 1e-6;
  if (eps != cfg.norm_eps())
    fail("rms_norm_eps", "is " + num(eps) + " but the run's model.norm_eps is " +
                             num(cfg.norm_eps()) + " (--set model.norm_eps=" + num(eps) + ")");
  const bool tied = j.value("tie_word_embeddings", false);  // LlamaConfig's default
  if (tied != cfg.tie_embeddings())
    fail("tie_word_embeddings", std::string("is ") + (tied ? "true" : "false") +
                                    " but the run's model.tie_embeddings is " +
                                    (cfg.tie_embeddings() ? "true" : "false") +
                                    " (--set model.tie_embeddings=" + (tied ? "true" : "false") +
                                    ")");
  const std::string why = llama_incompatibility(cfg);
  if (!why.empty())
    throw std::invalid_argument(file + ": a Llama's weights cannot initialise this run: " + why);
}

}  // namespace mod::hf
