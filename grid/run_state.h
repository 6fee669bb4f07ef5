// What a grid point's run directory says about it, read without loading any tensor: the step of
// model.safetensors (from its JSON header), the latest checkpoint, and metrics.csv (its last
// step and the validation losses, top-C and causal, logged at the final step). The trainer writes model.safetensors
// only when every step is done, so "finished" means: model.safetensors at the point's steps.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace mod::grid {

enum class RunStatus {
  NotStarted,  // no run directory, or nothing trained in it yet
  Partial,     // stopped or interrupted: checkpoints or metrics rows, no final weights
  Finished,    // model.safetensors at the point's steps
};
const char* status_name(RunStatus s);  // "not started", "partial", "finished"

struct RunState {
  RunStatus status = RunStatus::NotStarted;
  int64_t weights_step = -1;     // model.safetensors step; -1: no file
  int64_t checkpoint_step = -1;  // checkpoints/latest; -1: none
  int64_t metrics_step = -1;     // last row of metrics.csv; -1: no rows
  std::optional<double> final_val_loss;  // val_loss of the row at the point's final step
  // val_loss_causal of that row: routed models evaluated with causal (sampling) routing
  std::optional<double> final_val_loss_causal;
  double train_seconds = 0;  // sum over metrics rows of tokens_per_step / tokens_per_s
  std::string describe() const;  // e.g. "partial: checkpoint at step 200, metrics to step 230"
  std::string details() const;   // what describe() says after "partial: "
};

RunState inspect_run(const std::string& run_dir, int64_t steps, int64_t tokens_per_step);

}  // namespace mod::grid
