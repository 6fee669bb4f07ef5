// The training loop on one process or many: data, model, the optimizer (AdamW, or ZeRO-1's),
// schedule, clipping, gradient accumulation, periodic validation, a progress line, metrics.csv and
// TensorBoard scalars, and the final weights file. The run directory holds config.textproto,
// metrics.csv, tb/ and model.safetensors, written by world rank 0.
//
// Parallel layout (parallel.dp x parallel.tp x parallel.pp = world size): the model is built
// whole on every rank from the same seed, then parallel::parallelize shards it and returns the
// plan the steps run with (gradient buckets, clipping groups, the optimizer); each dp rank
// trains on its rows of every global batch. Losses and metrics are reduced over dp, so every
// layout logs what one process would. Under parallel.pp > 1 (train/trainer_pipeline.cpp) each
// stage's dp ranks run their blocks on their rows of the train.grad_accum micro-batches through
// the pipeline schedule (the first stage reads the tokens, the last the targets) and reduce the
// stage's gradients over dp; each rank holds only its stage's parameters (the others released
// after set-up, made whole only around whole-model uses); the loss comes from the last stage, and world rank 0 (the first
// stage) logs what every stage's blocks reported.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/backend.h"
#include "model/flops.h"
#include "model/transformer.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/pipeline_training.h"
#include "parallel/world.h"
#include "train/checkpoint/writer.h"
#include "train/data/loader.h"
#include "train/evaluate.h"
#include "train/grad_clip.h"
#include "train/run_metrics.h"
#include "train/test_hooks.h"

namespace mod::train {

// train.fusions.optimizer_weight_copies: the multi-tensor update, and under BF16 the optimizer's
// bf16 copies of the weights the forward reads (parallel/optimizer.h).
parallel::OptimizerFusion optimizer_fusion(const modtrain::TrainConfig& t);

class Trainer {
 public:
  // Collective over world (every rank constructs a Trainer with the same config). quiet: no
  // progress lines on stdout (the launcher sets it on ranks > 0 unless they log to files).
  // hooks: test-only faults and checks (train/test_hooks.h), none by default.
  Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet = false,
          parallel::Communicator& world = parallel::world(), const TestHooks& hooks = {});
  // Continues from a checkpoint before run(): "auto" takes the run directory's latest (and
  // starts fresh when there is none); anything else is a checkpoint or run directory. The
  // checkpoint may come from any dp x tp x pp layout, with or without ZeRO-1. Collective.
  void resume(const std::string& spec);
  // Starts from full parameters: a safetensors file (modtrain export, model.safetensors), or a
  // Hugging Face Llama directory (train/hf/import.h), whose MoD routers start fresh.
  void init_from(const std::string& path);

  // Runs the remaining steps; returns the last training loss (reduced over dp). Stops early,
  // after a checkpoint, when any rank got SIGTERM or SIGUSR1 (then stopped() is true).
  double run();
  bool stopped() const { return stopped_; }
  int64_t start_step() const { return start_step_; }  // steps done before run() (resume)
  // Under pp > 1 the other stages' parameters hold no bytes here (read them through
  // full_parameters); under ZeRO-3 neither do the rank's own between steps.
  const model::Transformer& model() const { return *model_; }
  const std::vector<double>& losses() const { return losses_; }  // one per step run here
  // The auxiliary losses (routers, predictors, MoE balance) of those steps, 0 without any.
  const std::vector<double>& aux_losses() const { return aux_losses_; }
  // The gradient norms (before clipping, reduced over dp) of those steps, as metrics.csv's.
  const std::vector<double>& grad_norms() const { return grad_norms_; }
  // This rank's highest bytes in use during any step run here (the device allocator's count).
  size_t peak_memory_bytes() const { return peak_memory_bytes_; }
  // Every parameter in full (tensor-parallel shards and experts gathered). Collective over the
  // tp and ep groups.
  std::vector<std::pair<std::string, Tensor>> full_parameters() const;
  const parallel::Mesh& mesh() const { return *mesh_; }
  // ZeRO-3's units (null below stage 3 and before the plan): tests read what they gathered.
  const parallel::ShardedUnits* sharded_units() const { return plan_.units.get(); }
  // Under pp > 1, after run(): the pipeline's measured bubble, the fraction of the stages' time
  // in the steps run here spent blocked on receives and on sends' completion (idle), against
  // that plus their forwards and backwards; per stage of this rank's pp group, and over them
  // all (their idle time over their total). Empty when pp is 1.
  struct MeasuredBubble {
    double total = 0;
    std::vector<double> per_stage;
    std::vector<double> compute_s;  // per stage: its forwards' and backwards' seconds a step
  };
  const std::optional<MeasuredBubble>& measured_bubble() const { return measured_bubble_; }

 private:
  void init_from_hf(const std::string& dir);
  // run()'s pieces: step, log and evaluate (trainer.cpp); checkpoint and stop
  // (trainer_checkpoint.cpp).
  void print_run_header(const model::FlopCount& flops) const;
  double peak_flops_per_process() const;
  StepMetrics timed_step(int64_t step);
  void log_step(int64_t step, const StepMetrics& m, double run_seconds) const;
  bool progress_due(int64_t step) const;  // a progress-line step (every log_every, and last)
  // The largest of every rank's value (one all-reduce over the world). Collective.
  double max_over_ranks(double value) const;
  // Rank 0 prints every rank's peak memory (one all-gather). Collective.
  void report_peak_memory() const;
  // train.profile_steps: start the device trace before this step, report after its last step.
  void profile_around_step(int64_t step, bool before);
  bool evaluation_due(int64_t step) const;
  // val_loss (top-C), agreement of the two routings, and after the last step val_loss_causal.
  void evaluate_validation(int64_t step, StepMetrics& m) const;
  // Same answer on every rank. With checkpoint.every_steps or every_minutes set: at those, and
  // after the last step.
  bool checkpoint_due(int64_t steps_done, double minutes_since_save);
  void save_checkpoint(int64_t steps_done, double elapsed);
  bool any_rank_stopping();
  void stop_after(int64_t steps_done);
  void write_weights();
  std::vector<ckpt::TensorEntry> checkpoint_entries();

  model::ForwardResult forward_batch(const Tensor& inputs, const Tensor& targets) const;
  // A step's results, left on the device until finish_step reads them.
  struct StepOutputs {
    Tensor loss, aux;  // f64 scalars: means over the micro-batches
    Tensor grad_norm;  // f64 scalar, before clipping
    Tensor predictor_grad_norm;  // the causal predictors' own (undefined without one)
    std::vector<model::RoutedBlockStats> stats;  // unresolved: device tensors
    std::vector<model::MoeStats> moe_stats;
    std::optional<double> pp_bubble;  // under pp on CPUs: this step's measured bubble (metrics.csv)
  };
  // One step (trainer_step.cpp) = load_step (host -> device), enqueue_step (device work only,
  // what a CUDA graph captures), finish_step (the one wait: results read, divergence checked).
  StepMetrics train_step(int64_t step);
  void load_step(int64_t step);
  StepOutputs enqueue_step(int64_t step);
  // enqueue_step under pp > 1 (trainer_pipeline.cpp): the host waits for each stage's step.
  StepOutputs enqueue_pipeline_step();
  // Under pp > 1: the partition and schedule, the tied embedding's group, and the norm groups
  // of the parameters this stage owns (set up by the constructor). No-op when pp is 1.
  void setup_pipeline();
  // Under pp > 1, while the result lives: every parameter whole on this rank, the other stages'
  // grown back and (broadcast) filled from their owners; released again at its end. Hold it
  // around anything that reads or writes the whole model. A no-op object at pp 1.
  parallel::OtherStagesWhole whole_across_stages(bool broadcast) const;
  // Under pp > 1 on CPUs: sets measured_bubble_ from every stage's idle and compute seconds (one
  // all-gather over pp) and rank 0 prints it beside the prediction. Collective; no-op at pp 1.
  void report_pipeline_bubble();
  StepMetrics finish_step(int64_t step, const StepOutputs& out);
  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  }
  // Host seconds by phase, summed since the profile window opened (train.profile_steps):
  // where the host is while the device idles.
  struct HostPhases {
    double load = 0, enqueue = 0, wait = 0, stats = 0, log = 0;
  };
  HostPhases host_phases_;
  // The norms before clipping (f64) and the factors the optimizer scales the gradients by, on
  // the device: the language model's, and the causal predictors' own (undefined without one).
  struct StepClip {
    ClipFactor model, predictor;
  };
  StepClip grad_clips();
  // The norms, then the optimizer's update with the clip factors (out's norms set).
  void clip_and_update(StepOutputs& out);
  // One per norm group: the device's table of its gradients, kept while they stay in place
  // (and alive as long as a captured step that reads it).
  std::vector<MultiTensorTable> norm_tables_;

  modtrain::RunConfig cfg_;
  std::string run_dir_;
  bool quiet_, writer_;  // writer_: world rank 0 writes files and prints progress
  // Under train.device CUDA with several processes: the world with NCCL for CUDA tensors (the
  // mesh's groups split from it); null otherwise.
  std::unique_ptr<parallel::Communicator> device_comm_;
  std::unique_ptr<parallel::Mesh> mesh_;
  data::Dataset data_;
  std::unique_ptr<model::Transformer> model_;
  Device device_ = Device::CPU;       // train.device: where parameters, batches and optimizer live
  parallel::ParallelPlan plan_;       // shards, gradient buckets, clipping groups, the optimizer
  std::unique_ptr<data::WindowLoader> loader_;
  // Under pp > 1 (setup_pipeline): the stages' blocks and this run's schedule.
  std::optional<parallel::PipelinePartition> pipeline_partition_;
  std::optional<parallel::PipelineSchedule> pipeline_schedule_;
  std::unique_ptr<parallel::Communicator> tied_embedding_group_;
  // This stage's seconds over the steps run here: blocked on transfers, and computing.
  double pipeline_wait_s_ = 0, pipeline_compute_s_ = 0;
  std::optional<MeasuredBubble> measured_bubble_;
  // The training shards' fingerprints, read once, on the first checkpoint or resume.
  const std::vector<data::ShardFingerprint>& data_fingerprint();
  // The dataset's tokenizer seal, recorded in checkpoints and weights (none: not sealed).
  std::optional<uint32_t> tokenizer_seal() const;
  std::vector<data::ShardFingerprint> data_fingerprint_;
  int64_t row_begin_ = 0, row_end_ = 0;  // this dp rank's rows of each global batch
  TestHooks hooks_;
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  int64_t start_step_ = 0;
  double elapsed_before_ = 0;  // seconds trained before a resume
  bool stopped_ = false;
  std::vector<double> losses_, aux_losses_, grad_norms_;
  size_t peak_memory_bytes_ = 0;
  // Set by run(): metrics.csv and tb/ (world rank 0), a token's training FLOPs and the rate MFU
  // is measured against (every process's share of the machine).
  std::unique_ptr<MetricsLog> log_;
  Clock::time_point profile_start_;  // host time at the trace's start
  double flops_per_token_ = 0, peak_flops_ = 0;
  std::vector<std::pair<Tensor, Tensor>> step_inputs_;  // per micro-batch: inputs, targets
  std::unique_ptr<CapturedWork> graph_;                 // train.cuda_graph, after warm-up
  StepOutputs graph_outputs_;                           // the tensors graph_ writes
};

}  // namespace mod::train
