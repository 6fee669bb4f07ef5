// `modtrain train --init-from DIR` from a Hugging Face LlamaForCausalLM directory (docs/hf.md):
// config.json plus model.safetensors, or shards listed by model.safetensors.index.json; f32 or
// bf16 (converted to f32 exactly). Invariant: config.json is checked against the run's model
// (train/hf/llama.h, errors name the field) and every tensor's name and shape before any weight
// is returned; tensors the file holds beyond the model's are an error, except rotary_emb's cache.
#pragma once

#include <map>
#include <string>

#include "configs/modtrain.pb.h"
#include "core/tensor.h"

namespace mod::hf {

// A directory holding config.json: what --init-from reads as a Hugging Face model.
bool is_hf_dir(const std::string& path);
// Such a directory written as ModtrainForCausalLM (config.json model_type "modtrain"): its
// model.safetensors holds modtrain's own names and loads as a modtrain weights file.
bool is_modtrain_dir(const std::string& dir);

// The dense parameters of cfg (every one llama_name() maps) by modtrain name, as F32 CPU tensors.
// MoD's routers and predictors are not among them: the caller keeps their fresh initialisation.
std::map<std::string, Tensor> read_llama(const std::string& dir, const modtrain::ModelConfig& cfg);

}  // namespace mod::hf
