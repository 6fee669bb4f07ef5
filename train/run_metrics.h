// What a run reports each step, every metric named once: the tables in run_metrics.cpp give
// metrics.csv's columns, a step's values and TensorBoard's tags, so the two files cannot drift
// apart. Also the progress line and the FLOP rate MFU is measured against.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/transformer.h"
#include "train/metrics/metrics_writer.h"

namespace mod::train {

// One step's metrics, reduced over dp (every rank holds the same). Unset: not reported this
// step (an empty cell, no TensorBoard scalar).
struct StepMetrics {
  std::optional<double> lm_loss, aux_loss, val_loss, lr, grad_norm, tokens_per_s, mfu;
  // The causal predictors' gradient norm, clipped apart from grad_norm (models with one).
  std::optional<double> predictor_grad_norm;
  // At the final evaluation of a routed model: the validation loss with causal routing.
  std::optional<double> val_loss_causal;
  // Bytes in use at their highest during the step (the allocator's count, core/backend.h), in
  // MiB: this rank's (metrics.csv and TensorBoard: world rank 0's), and at progress-line steps
  // the largest over every rank (one all-reduce then).
  std::optional<double> peak_memory_mb, peak_memory_max_mb;
  // Under parallel.pp > 1: the step's measured pipeline bubble, world rank 0's pp group's idle
  // seconds over their idle + compute seconds (the metrics.csv column exists only then).
  std::optional<double> pp_bubble;
  std::vector<model::RoutedBlockStats> routed;  // resolved, one per routed block
  // At evaluations of an MoD model: (block, share of the first validation sequences' tokens
  // on which causal routing chooses as top-C does).
  std::vector<std::pair<int, double>> agreement;
  std::vector<model::MoeStats> moe;  // resolved, one per MoE block
};

// metrics.csv and tb/ of a run directory (world rank 0 keeps one). A resumed run's steps after
// its checkpoint are dropped from both first, since it writes them again.
class MetricsLog {
 public:
  // pipelined: parallel.pp > 1 (metrics.csv gets pp_bubble, its last column, so
  // the others sit where one process's do; empty on a GPU, not measured there).
  MetricsLog(const std::string& run_dir, const model::Transformer& model, int64_t start_step,
             bool pipelined);
  void write(int64_t steps_done, const StepMetrics& m);

 private:
  modtrain::MoEConfig moe_;  // decides which MoE metrics exist
  std::unique_ptr<metrics::CsvWriter> csv_;
  std::unique_ptr<metrics::TensorBoardWriter> tb_;
};

// The line printed every train.log_every steps: loss (and validation loss), lr, tokens/s, MFU
// and the time left.
void print_progress(int64_t steps_done, int64_t steps, const StepMetrics& m, double eta_seconds);

// The SGEMM rate of this machine (1024^3, best of 12), measured anew on each call (about 0.2 s
// on 2 cores): shown beside the stated peak, which MFU divides by (core/cpu/cpu_peak.h).
double measured_peak_flops();

}  // namespace mod::train
