// `modtrain export --format hf`: a trained model as a Hugging Face directory that
// transformers.AutoModelForCausalLM.from_pretrained(DIR) loads with no custom code (docs/hf.md):
//   config.json             LlamaForCausalLM (train/hf/llama.h), f32
//   model.safetensors       every parameter under its HF name, f32, metadata format "pt"
//   generation_config.json  eos_token_id: the dataset's end-of-text id, if any
//   tokenizer.json          an HF tokenizer copied byte for byte; byte and bpe written as an
//                           equivalent tokenizer.json (train/hf/tokenizer_json.h)
//   tokenizer_config.json   PreTrainedTokenizerFast, no BOS added
// Invariant: everything is checked and built in memory first, then written to DIR.tmp and renamed
// to DIR, so a refused export writes nothing and DIR is never half written.
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
  std::string architecture;    // "LlamaForCausalLM"
  std::string tokenizer_kind;  // byte, bpe or hf
};

ExportSummary export_hf(const ExportOptions& o);

// The names an export writes (an existing DIR holding anything else is not replaced).
bool is_export_file(const std::string& name);

}  // namespace mod::hf
