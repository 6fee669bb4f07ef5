// parallel_bench's theory side: the layouts it measures and the minimum bytes each rank must
// send per step for a config and layout (ring all-reduce 2(n-1)/n x S, all-gather and
// all-to-all (n-1)/n x S), per group (dp, edp, tp, ep), with the formula spelled out for the
// printout. docs/parallel.md explains each term.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"

namespace mod::bench {

struct Layout {
  int dp = 1, tp = 1, ep = 1;  // world = dp x tp x pp; ep divides dp (parallel/mesh.h)
  int zero_stage = 0;  // parallel.zero_stage; stages 1 and 2 send the same bytes
  int pp = 1, v = 1;   // pipeline stages (ranks) and virtual stages per rank (interleaved 1F1B)
  bool sp = false;     // parallel.sequence_parallel (tp > 1)
  bool sharded() const { return zero_stage >= 1; }  // reduce-scatter + all-gather over dp
  bool stage3() const { return zero_stage >= 3; }   // parameters all-gathered per unit
  int world() const { return dp * tp * pp; }
  // "dp2", "tp2", "dp2xtp2", "dp2+ep2", "dp2+zero1", "dp2+ep2+zero2", "dp2+zero3", "tp2+sp",
  // "dp8xtp4xpp2", "dp8xpp4+v2"
  std::string label() const;
};
// dpN, tpN, ppN or a product such as dpNxtpM or dpNxtpMxppK, then any of "+epK", "+zero1" (2,
// 3), "+sp" and "+vK" (interleaved 1F1B, K virtual stages a rank; needs pp); anything else is an
// error quoting the text. Examples: "dp2+ep2", "dp4xtp2+ep2+zero1", "dp8+zero3", "dp2xtp2+sp",
// "dp8xtp4xpp2+v2".
Layout parse_layout(const std::string& text);
// What fits n ranks: 1 -> dp1; 2 -> dp2, tp2, dp2+zero1 (and dp2+ep2 with experts); 4 ->
// dp2xtp2, dp4, tp4 (and dp2xtp2+ep2, dp4+ep2 with experts).
std::vector<Layout> default_layouts(int n, bool experts);

// Per step and rank; bytes are f32 gradients, activations and the cross-entropy's statistics.
// Parameters: P_split (tp-sharded matrices, embedding, untied LM head), P_expert (the E expert
// MLPs of every MoE block, ep-sharded), P_replicated (norms, MoD and MoE routers, predictors).
struct Napkin {
  int64_t params = 0, split = 0, expert = 0, replicated = 0;
  int64_t outer = 0;     // ZeRO-3's outer unit: embedding, final norm, LM head
  int64_t seq_partial = 0;  // P_seq: replicated parameters whose gradients SP sums over tp
  double local = 0;         // P_local = P_split / tp + P_replicated: dense parameters on a rank
  double expert_local = 0;  // P_expert / ep
  int edp = 1;              // expert data-parallel group: dp / ep x tp ranks
  double valid_share = 1;   // valid expert slots / all slots (1 under expert choice)
  double dp_bytes = 0, edp_bytes = 0, tp_bytes = 0;
  double ep_slot_bytes = 0;  // what the static-slot all-to-alls send (every slot, padding too)
  double ep_bytes = 0;       // the minimum: valid_share x ep_slot_bytes
  std::string params_formula, dp_formula, edp_formula, tp_formula, ep_formula;
  double total() const { return dp_bytes + edp_bytes + tp_bytes + ep_bytes; }
};
// valid_share: measured share of expert slots holding a token (token choice pads the rest);
// 1 for expert choice, where every slot is filled.
Napkin napkin(const modtrain::RunConfig& cfg, const Layout& l, double valid_share = 1);

// Slots per (sequence, expert) of each MoE block (0 for a dense MLP): K_b for the T_b tokens
// that enter the block's MLP (C in a routed block).
std::vector<int64_t> expert_slots_by_block(const modtrain::ModelConfig& m);

// Split by tp (parallel/parallelize.cpp parallelize_tensor): the attention and dense-MLP
// matrices, the embedding and an untied LM head.
bool tp_split_parameter(const std::string& name);
// "blocks.7.attn.wq.weight" -> 7; -1 for anything outside the blocks.
int block_of_parameter(const std::string& name);
// Sequence parallelism's partial parameters (P_seq, by name as parallel/parallelize.cpp picks
// them): neither tp-split nor an expert's, and not a routed block's norm (it sees the block's
// gathered rows, whole). routed_block: model::routed_blocks.
bool seq_partial_parameter(const std::string& name, const std::vector<bool>& routed_block);

// printf into a string (up to 6 numbers).
std::string fmt(const char* format, double a = 0, double b = 0, double c = 0, double d = 0,
                double e = 0, double f = 0);

}  // namespace mod::bench
