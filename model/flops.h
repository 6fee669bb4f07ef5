// FLOP accounting: one function of the model config, used by MFU, the `flops` command and the
// isoFLOP grids. Counts multiply-adds as 2 FLOPs in every matmul (projections, MLP, router,
// predictor, LM head, MoE routers, the experts on the K slots each one runs, and the causal
// attention QK^T and PV on the keys each query sees); norms, softmax and elementwise work are left out, as in Kaplan et al. and Chinchilla.
#pragma once

#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::model {

struct BlockFlops {
  int block = 0;
  bool routed = false;
  int64_t capacity = 0;         // tokens per sequence that pass through (S when dense)
  double forward_per_token = 0;  // averaged over all S tokens of the sequence
  bool moe = false;              // an MoE MLP (active experts counted)
};

struct FlopCount {
  double forward_per_token = 0;   // whole model, per sequence token
  double training_per_token = 0;  // forward + backward (backward = 2 x forward)
  double lm_head_per_token = 0;
  double router_and_predictor_per_token = 0;
  std::vector<BlockFlops> blocks;
  int64_t parameters = 0;  // trainable parameters (embedding counted once when tied)
  int64_t non_embedding_parameters = 0;
};

FlopCount count_flops(const modtrain::ModelConfig& cfg);

std::string describe_flops(const modtrain::ModelConfig& cfg);  // the `flops` command's table

}  // namespace mod::model
