// Test-only hooks: faults to inject and a debug check, read once at start-up (modtrain train)
// and only under the one switch MOD_TEST_HOOKS=1; without it every hook variable is ignored, so
// a stray export cannot kill or slow a production run (docs/environment.md lists them all):
//   MOD_FAULT_EXIT_RANK=r MOD_FAULT_EXIT_STEP=s   world rank r exits (code 3) mid-step s
//   MOD_CHECKPOINT_FAULT=after_shard|after_metadata|after_rename  the save kills its process there
//   MOD_CHECK_TP_ROUTING=1                        every step, the tp ranks compare their routing
//   MOD_FAULT_NAN_STEP=s                          a weight turns NaN before step s (divergence)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

#include "train/checkpoint/writer.h"

namespace mod::train {

struct TestHooks {
  // World rank exit_rank exits with code 3 in the middle of step exit_step (1-based), between
  // its forward and backward (under pp, as its stage's step begins, its neighbours waiting on it
  // mid-step), as a crashed or OOM-killed process would. -1: none.
  int exit_rank = -1;
  int64_t exit_step = 0;
  ckpt::FaultPoint checkpoint_fault = ckpt::FaultPoint::None;  // where a save kills its process
  bool check_tp_routing = false;  // parallel::check_same_routing after every training forward
  // Set by tests only (no variable): every training forward's routed_idx, copied to the host,
  // is appended here (the parity tests compare layouts' routing step by step; under pp, each
  // micro-batch's routed blocks of this rank's chunks, in block order). Null: off.
  std::vector<std::vector<Tensor>>* routing_log = nullptr;
  // Set by tests only, not under pp: every training forward's MoE selections (MoeStats::slots,
  // [E*B*K] i64 per MoE layer, in block order), copied to the host. Null: off.
  std::vector<std::vector<Tensor>>* moe_slots_log = nullptr;
  // Before step nan_step (1-based) the first weight is overwritten with NaN, so the step's loss
  // is non-finite whatever the machine's rounding (a real divergence depends on it). 0: none.
  int64_t nan_step = 0;
  // Set by tests only (no variable): under pp every rank keeps the other stages' parameters
  // (the trainer before it released them), so a test measures what releasing saves.
  bool keep_other_stages_parameters = false;

  bool exits_in(int world_rank, int64_t step) const {  // step 0-based
    return exit_rank >= 0 && world_rank == exit_rank && step + 1 == exit_step;
  }
  bool poisons(int64_t step) const { return nan_step > 0 && step + 1 == nan_step; }  // 0-based
};

// The hooks the environment asks for. A bad value of the switch or, under it, of a hook throws
// std::invalid_argument naming the variable, its value and what was expected. *ignored (when
// given) is set to a line naming the hook variables set without the switch, or "".
TestHooks read_test_hooks(std::string* ignored = nullptr);

}  // namespace mod::train
