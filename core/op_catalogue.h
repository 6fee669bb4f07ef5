// The op catalogue: every op modtrain has, its name and whether it has a backward rule.
// Adding an op means adding an enum entry and a row in kOpInfo: the table's size is deduced from
// its rows, so the static_asserts fail until both agree and row i describes Op i; the
// gradient-check harness then fails until a case for the op exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace mod {

enum class Op : uint16_t {
  Reshape,
  MatMul,
  // x . w in w's wider dtype from x in its own (core/ops/matmul.h row_scores).
  RowScores,
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
  // The residual add fused with the norm after it: two outputs, the sum and its norm.
  AddRMSNorm,
  AddLayerNorm,
  GELU,
  SiLU,
  SwiGLU,
  // A GELU MLP's up projection, GELU and down projection as one op (core/ops/mlp.h).
  GeluMlp,
  Sigmoid,
  Softmax,
  CrossEntropy,
  LinearCrossEntropy,  // the LM head and its loss, fused (core/ops/loss.h)
  Rope,
  Attention,
  GatherRows,
  ScatterAddRows,
  // x + the gate-weighted rows scattered at idx (core/ops/routing.h scatter_gated_rows).
  ScatterGatedRows,
  TopK,
  BCEWithLogits,
  LogSumExp,
  Cast,
  AdamW,
  SumSquaresMulti,  // the global gradient norm's square over a list of tensors (core/ops/optim.h)
  // Tensor-parallel collectives (parallel/tp_mappings.h); see OpInfo::collective.
  CopyToTp,
  ReduceFromTp,
  GatherFromTp,
  ScatterToTp,
  // Sequence parallelism's pair (parallel/tp_mappings.h): the residual stream split over T.
  GatherSeqFromTp,
  ReduceScatterSeqToTp,
  // Around a layer that runs whole on every tp rank (the MoE layer) under sequence parallelism.
  GatherSeqWholeFromTp,
  SplitSeqToTp,
  VocabParallelCrossEntropy,
  // Expert-parallel all-to-all pair (parallel/expert_parallel.h).
  ExpertDispatch,
  ExpertCombine,
  // ZeRO-3's unit boundary (parallel/zero3.h): identity on a block's outputs, whose backward
  // all-gathers the block's parameters before any of its ops' backward runs.
  GatherUnitForBackward,
  // A recompute region and the node of each of its outputs (core/recompute.h).
  Recompute,
  RecomputeOutput,
  Count
};

struct OpInfo {
  Op op;  // the op this row describes: row i must be Op i
  const char* name;
  bool differentiable;  // false: forward only (selection, optimizer update)
  // true: talks to a communicator; its gradient cases live in tests/parallel (run at world size
  // one and under mpirun), not in the core harness.
  bool collective = false;
};

inline constexpr OpInfo kOpInfo[] = {
    {Op::Reshape, "reshape", true},
    {Op::MatMul, "matmul", true},
    {Op::RowScores, "row_scores", true},
    {Op::Add, "add", true},
    {Op::Sub, "sub", true},
    {Op::Mul, "mul", true},
    {Op::Scale, "scale", true},
    {Op::BiasAdd, "bias_add", true},
    {Op::Sum, "sum", true},
    {Op::Mean, "mean", true},
    {Op::Embedding, "embedding", true},
    {Op::RMSNorm, "rmsnorm", true},
    {Op::LayerNorm, "layernorm", true},
    {Op::AddRMSNorm, "add_rmsnorm", true},
    {Op::AddLayerNorm, "add_layernorm", true},
    {Op::GELU, "gelu", true},
    {Op::SiLU, "silu", true},
    {Op::SwiGLU, "swiglu", true},
    {Op::GeluMlp, "gelu_mlp", true},
    {Op::Sigmoid, "sigmoid", true},
    {Op::Softmax, "softmax", true},
    {Op::CrossEntropy, "cross_entropy", true},
    {Op::LinearCrossEntropy, "linear_cross_entropy", true},
    {Op::Rope, "rope", true},
    {Op::Attention, "attention", true},
    {Op::GatherRows, "gather_rows", true},
    {Op::ScatterAddRows, "scatter_add_rows", true},
    {Op::ScatterGatedRows, "scatter_gated_rows", true},
    {Op::TopK, "topk", false},
    {Op::BCEWithLogits, "bce_with_logits", true},
    {Op::LogSumExp, "logsumexp", true},
    {Op::Cast, "cast", true},
    {Op::AdamW, "adamw", false},
    {Op::SumSquaresMulti, "sum_squares_multi", false},
    {Op::CopyToTp, "copy_to_tp", true, true},
    {Op::ReduceFromTp, "reduce_from_tp", true, true},
    {Op::GatherFromTp, "gather_from_tp", true, true},
    {Op::ScatterToTp, "scatter_to_tp", true, true},
    {Op::GatherSeqFromTp, "gather_seq_from_tp", true, true},
    {Op::ReduceScatterSeqToTp, "reduce_scatter_seq_to_tp", true, true},
    {Op::GatherSeqWholeFromTp, "gather_seq_whole_from_tp", true, true},
    {Op::SplitSeqToTp, "split_seq_to_tp", true, true},
    {Op::VocabParallelCrossEntropy, "vocab_parallel_cross_entropy", true, true},
    {Op::ExpertDispatch, "expert_dispatch", true, true},
    {Op::ExpertCombine, "expert_combine", true, true},
    {Op::GatherUnitForBackward, "gather_unit_for_backward", true, true},
    {Op::Recompute, "recompute", true},
    {Op::RecomputeOutput, "recompute_output", true},
};
static_assert(std::size(kOpInfo) == static_cast<size_t>(Op::Count),
              "kOpInfo must have one row per Op");

// Row i describes Op i, so op_name(op) and friends index the table by the op.
constexpr bool op_rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kOpInfo); ++i)
    if (kOpInfo[i].op != static_cast<Op>(i)) return false;
  return true;
}
static_assert(op_rows_in_enum_order(), "kOpInfo's rows must follow enum Op's order");

inline const char* op_name(Op op) { return kOpInfo[static_cast<size_t>(op)].name; }
inline bool op_differentiable(Op op) { return kOpInfo[static_cast<size_t>(op)].differentiable; }
inline bool op_collective(Op op) { return kOpInfo[static_cast<size_t>(op)].collective; }

}  // namespace mod
