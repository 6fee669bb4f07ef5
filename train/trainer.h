// The training loop on one process or many: data, model, AdamW (or ZeRO-1), schedule,
// clipping, gradient accumulation, periodic validation, a progress line, metrics.csv and
// TensorBoard scalars, and the final weights file. The run directory holds config.textproto,
// metrics.csv, tb/ and model.safetensors, written by world rank 0.
//
// Parallel layout (parallel.dp x parallel.tp = world size): the model is built whole on every
// rank from the same seed, then tensor-parallelised; each dp rank trains on its rows of every
// global batch, and gradients are averaged over dp in buckets during backward. Losses and
// metrics are reduced over dp, so every layout logs what one process would.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/parallelize.h"
#include "parallel/world.h"
#include "parallel/zero1.h"
#include "train/checkpoint/writer.h"
#include "train/data/loader.h"
#include "train/optimizer.h"

namespace mod::train {

struct DataSplits {
  std::shared_ptr<const std::vector<uint32_t>> train, val;
  uint32_t vocab_size = 0;
};
// Reads dir/train.bin and dir/val.bin; the vocabulary must match model.vocab_size.
DataSplits load_splits(const std::string& dir, int64_t model_vocab);

struct EvalResult {
  double loss = 0;       // mean over the evaluated batches
  int64_t tokens = 0;
};
// Under data parallelism (dp given), rank r of dp evaluates batches r, r + dp, ... and the
// result is reduced over dp; every rank returns the same value.
EvalResult evaluate(const model::Transformer& model, const std::vector<uint32_t>& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode,
                    parallel::Communicator* dp = nullptr);

// The FLOP rate MFU is measured against: the SGEMM rate of this machine, measured once.
double measured_peak_flops();

class Trainer {
 public:
  // Collective over world (every rank constructs a Trainer with the same config). quiet: no
  // progress lines on stdout (the launcher sets it on ranks > 0 unless they log to files).
  Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet = false,
          parallel::Communicator& world = parallel::world());
  // Continues from a checkpoint before run(): "auto" takes the run directory's latest (and
  // starts fresh when there is none); anything else is a checkpoint or run directory. The
  // checkpoint may come from any dp x tp layout, with or without ZeRO-1. Collective.
  void resume(const std::string& spec);
  // Starts from the full parameters in a safetensors file (modtrain export, model.safetensors).
  void init_from(const std::string& safetensors_path);

  // Runs the remaining steps; returns the last training loss (reduced over dp). Stops early,
  // after a checkpoint, when any rank got SIGTERM or SIGUSR1 (then stopped() is true).
  double run();
  bool stopped() const { return stopped_; }
  int64_t start_step() const { return start_step_; }  // steps done before run() (resume)
  const model::Transformer& model() const { return *model_; }
  const std::vector<double>& losses() const { return losses_; }  // one per step run here
  // Every parameter in full (tensor-parallel shards and experts gathered). Collective over the
  // tp and ep groups.
  std::vector<std::pair<std::string, Tensor>> full_parameters() const;
  const parallel::Mesh& mesh() const { return *mesh_; }

 private:
  double peak_flops_per_process() const;
  model::ForwardResult forward_batch(const Tensor& inputs, const Tensor& targets) const;
  // A step's results, left on the device until finish_step reads them.
  struct StepOutputs {
    Tensor loss, aux;  // f64 scalars: means over the micro-batches
    Tensor grad_norm;  // f64 scalar, before clipping
    std::vector<model::RoutedBlockStats> stats;  // unresolved: device tensors
    std::vector<model::MoeStats> moe_stats;
  };
  // One step (trainer_step.cpp) = load_step (host -> device), enqueue_step (device work only,
  // what a CUDA graph captures), finish_step (the one wait: results read, divergence checked).
  double train_step(int64_t step);
  void load_step(int64_t step);
  StepOutputs enqueue_step(int64_t step);
  double finish_step(int64_t step, const StepOutputs& out);
  LeafGradReady gradient_ready_hook();
  Tensor global_grad_norm_and_clip();  // the norm before clipping, f64 on the device
  void reduce_step_metrics(double& loss, double& aux);
  // The ZeRO-1 optimizer holding a parameter's moments (zero1_experts_ for expert weights).
  parallel::ShardedAdamW& zero1_for(const std::string& name) const;
  // Checkpoints (trainer_checkpoint.cpp).
  std::vector<ckpt::TensorEntry> checkpoint_entries();
  void save_checkpoint(int64_t steps_done, double elapsed);
  bool checkpoint_due(int64_t steps_done, double minutes_since_save);  // same answer on every rank
  bool any_rank_stopping();

  modtrain::RunConfig cfg_;
  std::string run_dir_;
  bool quiet_, writer_;  // writer_: world rank 0 writes files and prints progress
  // Under train.device CUDA with several processes: the world with NCCL for CUDA tensors (the
  // mesh's groups split from it); null otherwise.
  std::unique_ptr<parallel::Communicator> device_comm_;
  std::unique_ptr<parallel::Mesh> mesh_;
  DataSplits data_;
  std::unique_ptr<model::Transformer> model_;
  Device device_ = Device::CPU;  // train.device: where parameters, batches and optimizer live
  parallel::ShardMap shards_;
  std::unique_ptr<AdamW> optimizer_;                 // unless ZeRO-1
  // ZeRO-1 (parallel.zero1): moments of dense parameters sharded over dp, of expert weights over
  // their expert data-parallel group; zero1_index_[i] is parameter i's index in its optimizer.
  std::unique_ptr<parallel::ShardedAdamW> zero1_, zero1_experts_;
  std::vector<size_t> zero1_index_;
  std::unique_ptr<parallel::GradBucketer> buckets_;          // dense parameters over dp (dp > 1)
  std::unique_ptr<parallel::GradBucketer> expert_buckets_;  // expert weights over edp
  std::unique_ptr<data::WindowLoader> loader_;
  int64_t row_begin_ = 0, row_end_ = 0;  // this dp rank's rows of each global batch
  bool check_routing_ = false;           // MOD_CHECK_TP_ROUTING=1
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  int64_t start_step_ = 0;
  double elapsed_before_ = 0;  // seconds trained before a resume
  bool stopped_ = false;
  std::vector<double> losses_;
  std::vector<model::RoutedBlockStats> last_stats_;
  std::vector<model::MoeStats> last_moe_stats_;
  double last_aux_ = 0, last_grad_norm_ = 0;
  std::vector<std::pair<Tensor, Tensor>> step_inputs_;  // per micro-batch: inputs, targets
  std::unique_ptr<CapturedWork> graph_;                 // train.cuda_graph, after warm-up
  StepOutputs graph_outputs_;                           // the tensors graph_ writes
};

}  // namespace mod::train
