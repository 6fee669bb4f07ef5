// The single-process training loop: data, model, AdamW, schedule, clipping, gradient
// accumulation, periodic validation, a progress line, metrics.csv and TensorBoard scalars, and
// the final weights file. The run directory holds config.textproto, metrics.csv, tb/ and
// model.safetensors.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "configs/modtrain.pb.h"
#include "core/data/loader.h"
#include "core/model/transformer.h"
#include "core/train/optimizer.h"

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
EvalResult evaluate(const model::Transformer& model, const std::vector<uint32_t>& tokens,
                    int64_t seq_len, int64_t batch, int64_t max_batches, model::RoutingMode mode);

// The FLOP rate MFU is measured against: the SGEMM rate of this machine, measured once.
double measured_peak_flops();

class Trainer {
 public:
  Trainer(modtrain::RunConfig cfg, std::string run_dir, bool quiet = false);
  // Runs every step; returns the final training loss.
  double run();
  const model::Transformer& model() const { return *model_; }
  const std::vector<double>& losses() const { return losses_; }  // one per step

 private:
  double train_step(int64_t step);

  modtrain::RunConfig cfg_;
  std::string run_dir_;
  bool quiet_;
  DataSplits data_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<data::WindowLoader> loader_;
  std::vector<double> losses_;
  std::vector<model::RoutedBlockStats> last_stats_;
  double last_aux_ = 0, last_grad_norm_ = 0;
};

}  // namespace mod::train
