// The op catalogue: every op modtrain has, its name and whether it has a backward rule.
// Adding an op means adding an enum entry and a row in kOpInfo (the static_assert fails until
// both agree); the gradient-check harness then fails until a case for the op exists.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace mod {

enum class Op : uint16_t {
  Reshape,
  MatMul,
  Add,
  Sub,
  Mul,
  Scale,
  BiasAdd,
  Sum,
  Mean,
  Embedding,
  RMSNorm,
  LayerNorm,
  GELU,
  SiLU,
  SwiGLU,
  Sigmoid,
  Softmax,
  CrossEntropy,
  Rope,
  Attention,
  GatherRows,
  ScatterAddRows,
  TopK,
  BCEWithLogits,
  LogSumExp,
  Cast,
  AdamW,
  // Tensor-parallel collectives (parallel/tp_mappings.h); see OpInfo::collective.
  CopyToTp,
  ReduceFromTp,
  GatherFromTp,
  ScatterToTp,
  VocabParallelCrossEntropy,
  // Expert-parallel all-to-all pair (parallel/expert_parallel.h).
  ExpertDispatch,
  ExpertCombine,
  // A recompute region and the node of each of its outputs (core/recompute.h).
  Recompute,
  RecomputeOutput,
  Count
};

struct OpInfo {
  const char* name;
  bool differentiable;  // false: forward only (selection, optimizer update)
  // true: talks to a communicator; its gradient cases live in tests/parallel (run at world size
  // one and under mpirun), not in the core harness.
  bool collective = false;
};

inline constexpr std::array<OpInfo, static_cast<size_t>(Op::Count)> kOpInfo = {{
    {"reshape", true},
    {"matmul", true},
    {"add", true},
    {"sub", true},
    {"mul", true},
    {"scale", true},
    {"bias_add", true},
    {"sum", true},
    {"mean", true},
    {"embedding", true},
    {"rmsnorm", true},
    {"layernorm", true},
    {"gelu", true},
    {"silu", true},
    {"swiglu", true},
    {"sigmoid", true},
    {"softmax", true},
    {"cross_entropy", true},
    {"rope", true},
    {"attention", true},
    {"gather_rows", true},
    {"scatter_add_rows", true},
    {"topk", false},
    {"bce_with_logits", true},
    {"logsumexp", true},
    {"cast", true},
    {"adamw", false},
    {"copy_to_tp", true, true},
    {"reduce_from_tp", true, true},
    {"gather_from_tp", true, true},
    {"scatter_to_tp", true, true},
    {"vocab_parallel_cross_entropy", true, true},
    {"expert_dispatch", true, true},
    {"expert_combine", true, true},
    {"recompute", true},
    {"recompute_output", true},
}};
static_assert(kOpInfo.size() == static_cast<size_t>(Op::Count), "kOpInfo must list every Op");

inline const char* op_name(Op op) { return kOpInfo[static_cast<size_t>(op)].name; }
inline bool op_differentiable(Op op) { return kOpInfo[static_cast<size_t>(op)].differentiable; }
inline bool op_collective(Op op) { return kOpInfo[static_cast<size_t>(op)].collective; }

}  // namespace mod
