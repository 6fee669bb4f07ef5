// `modtrain export --format hf`: a trained model as a Hugging Face directory that
// transformers.AutoModelForCausalLM.from_pretrained(DIR) loads (docs/hf.md). A dense SwiGLU/RMS
// model is a LlamaForCausalLM with no custom code; any other model (GELU, LayerNorm, MoD, MoE,
// integrated and staged MoDE) is a ModtrainForCausalLM, whose modeling code is written beside it
// (trust_remote_code).
//   config.json             LlamaForCausalLM (train/hf/llama.h), or ModtrainConfig's fields; f32
//   model.safetensors       every parameter, f32, under its HF name (Llama) or its modtrain name,
//                           metadata format "pt"
//   generation_config.json  eos_token_id: the dataset's end-of-text id, if any
//   tokenizer.json          an HF tokenizer copied byte for byte; byte and bpe written as an
//                           equivalent tokenizer.json (train/hf/tokenizer_json.h)
//   tokenizer_config.json   PreTrainedTokenizerFast, no BOS added
//   configuration_modtrain.py, modeling_modtrain.py  (ModtrainForCausalLM only) train/hf/'s
// Invariant: everything is checked and built in memory first, then written to DIR + kTempSuffix
// and renamed to DIR, so a refused export writes nothing and DIR is never half written.
#pragma once

#include <cstdint>
#include <string>

namespace mod::hf {

struct ExportOptions {
  std::string from;       // weights file, checkpoint or run directory (train::load_model)
  std::string out_dir;    // created; an existing one must hold only an earlier export's files
  std::string tokenizer;  // empty: the dataset's (the run's data.dir); else a tokenizer file
};
struct ExportSummary {
  std::string source;          // what load_model read
  int64_t step = 0;
  int64_t tensors = 0, bytes = 0;
  std::string architecture;    // "LlamaForCausalLM" or "ModtrainForCausalLM"
  std::string tokenizer_kind;  // byte, bpe or hf
};

ExportSummary export_hf(const ExportOptions& o);

// The sibling directory an export is written to before its rename: DIR + ".hf-export.tmp".
extern const char* const kTempSuffix;

// The names an export writes (an existing DIR holding anything else is not replaced).
bool is_export_file(const std::string& name);

}  // namespace mod::hf
