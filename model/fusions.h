// Which fused ops the model runs (train.fusions, configs/modtrain.proto FusionConfig). A fused op
// computes what the ops it replaces compute (bit for bit on the CPU where the op order allows),
// so a switch trades speed, never results. A plain struct of bools: one member per switch.
#pragma once

#include "configs/modtrain.pb.h"

namespace mod::model {

struct Fusions {
  // A residual add and the norm after it as one op (core/ops/norm.h add_rmsnorm): in a block,
  // x + attn then norm2; between blocks, x + mlp then the next block's norm1 or the final norm.
  bool add_norm = true;
  // A GELU MLP's up GEMM, GELU and down GEMM as one op with GELU in the GEMMs' epilogues
  // (core/ops/mlp.h gelu_mlp). SwiGLU MLPs and MoE experts run unfused.
  bool gelu_mlp = true;
  // MoD's router scores and the predictor's logit from activations narrower than the master
  // weights (bf16 under f32) read as they are (core/ops/matmul.h row_scores), not cast first.
  bool router_scores = true;
  // MoD's gate multiply, scatter and residual add as one op (core/ops/routing.h
  // scatter_gated_rows), in a routed block that is not recomputed.
  bool routed_scatter = true;
};

// The switches a run's train.fusions sets.
inline Fusions fusions_from(const modtrain::TrainConfig& train) {
  Fusions f;
  f.add_norm = train.fusions().add_norm();
  f.gelu_mlp = train.fusions().gelu_mlp();
  f.router_scores = train.fusions().router_scores();
  f.routed_scatter = train.fusions().routed_scatter();
  return f;
}

}  // namespace mod::model
