// What each of a Transformer's parameters is, from its name alone: what AdamW's weight-decay
// policies (optimizer.decay_policy) and the causal predictor's own gradient clip select. The
// names are the layer constructors' (model/block.cpp, layers.cpp, moe.cpp; parameter_shapes.h).
#pragma once

#include <string>

namespace mod::model {

enum class ParameterRole {
  Matrix,      // a weight matrix: attention, MLP, experts, routers, predictors, an untied head
  Embedding,   // embed.weight (tied: also the LM head)
  NormOrBias,  // a norm's gain (and LayerNorm's bias) or a linear layer's bias
};
ParameterRole parameter_role(const std::string& name);

// blocks.<b>.predictor.*: the causal predictor of MoD's PREDICTOR method, trained on the detached
// block input and clipped by its own norm, so the language model never sees it.
bool is_causal_predictor(const std::string& name);

// Read as its f32 master even under a narrower autocast, never only through its weight copy:
// the embedding table (the lookup gathers master rows, then casts them; tied, the head also
// reads its copy), MoD's router and the causal predictor's logit layer and MoE's router
// (in_master_precision, model/layers.h: ranked and thresholded scores). Every other parameter
// the forward reads only through autocast, so its bf16 weight copy stands for it: ZeRO-3
// gathers those into the copies alone (parallel/zero3.h).
bool read_as_master(const std::string& name);

}  // namespace mod::model
