// modtrain's dense transformer as Hugging Face's LlamaForCausalLM (docs/hf.md): the tensor names,
// config.json both ways, and what a model must be for the two to compute the same function.
// Invariant: a model that llama_incompatibility() accepts, written under llama_name()s with
// llama_config_json(), gives transformers' logits to float tolerance, with no permutation:
//   RoPE     modtrain rotates pairs (i, i + Dh/2) by pos * theta^(-2i/Dh) (core/cpu/ops/rope.cpp),
//            which is Llama's rotate_half with cos/sin repeated over both halves;
//   scaling  softmax(q k^T / sqrt(Dh)), Dh = d_model / n_heads, as Llama's head_dim**-0.5;
//   norms    x / sqrt(mean(x^2) + eps) * weight before attention, before the MLP and at the end,
//            the eps inside the root, as LlamaRMSNorm;
//   MLP      down(silu(gate(x)) * up(x)): modtrain's mlp.gate/up/down are gate_proj/up_proj/
//            down_proj, every Linear stored [out, in] as torch.nn.Linear.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "configs/modtrain.pb.h"

namespace mod::hf {

// The HF name of a modtrain parameter ("blocks.3.attn.wq.weight" ->
// "model.layers.3.self_attn.q_proj.weight"); nullopt for one Llama has no place for (MoD's
// router and predictor, MoE experts).
std::optional<std::string> llama_name(const std::string& modtrain_name);

// Why cfg's dense weights cannot be a LlamaForCausalLM ("" when they can): a GELU MLP, LayerNorm
// or MoE. MoD routers are not counted here: export refuses them, import starts them fresh.
std::string llama_incompatibility(const modtrain::ModelConfig& cfg);

// config.json for cfg as LlamaForCausalLM, f32; eos: the dataset's end-of-text id, if any.
nlohmann::ordered_json llama_config_json(const modtrain::ModelConfig& cfg,
                                         std::optional<uint32_t> eos);

// Checks an HF config.json (already parsed; file names it in errors) against cfg: architecture
// LlamaForCausalLM, every shape, num_key_value_heads (no GQA), no biases, silu, rms_norm_eps,
// the rope theta and no rope scaling, tie_word_embeddings. Throws std::invalid_argument naming
// the file, the field, both values and the --set that would match where there is one.
void check_llama_config(const nlohmann::json& j, const std::string& file,
                        const modtrain::ModelConfig& cfg);

}  // namespace mod::hf
