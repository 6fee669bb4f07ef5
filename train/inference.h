// What a trained weights file (train/weights.h) is used for besides training: its validation
// loss (`modtrain eval`) and text generated from a prompt (`modtrain sample`). Invariant: a
// routed model is evaluated with top-C routing, as trained, and with causal routing, as sampled,
// on the same batches, so the two losses are comparable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/weights.h"
#include "model/sampler.h"
#include "train/inspect.h"

namespace mod::train {

struct WeightsEval {
  std::string name;  // the run config's name
  int64_t step = 0;  // the weights' training step
  std::string data_dir;
  int64_t tokens = 0;  // tokens evaluated
  bool routed = false;                // MoD or MoE blocks; false: a dense model
  double top_c_loss = 0;              // routing as trained; a dense model's only loss
  std::optional<double> causal_loss;  // for routed models (MoD, MoE) only
  std::string no_causal_loss;         // why a routed model has none (causal.method NONE)
};
// Validation loss of weights on data_dir/val.bin (empty data_dir: the run's data.dir; batches
// or batch_size 0: the run's train.eval_batches, train.batch_size). weights: whatever
// load_model (train/weights.h) takes.
WeightsEval evaluate_weights(const std::string& weights, const std::string& data_dir,
                             int64_t batches, int64_t batch_size, const LoadChecks& checks = {});
// `modtrain eval`'s table: a title line, then each loss labelled by the routing it ran with
// ("dense (no routed blocks)" for a dense model's only one), six significant digits.
std::string eval_table(const WeightsEval& r);

struct SampleOptions {
  std::string weights;  // as for evaluate_weights
  std::string prompt;
  std::string prompt_file;  // non-empty: one prompt a line (empty lines skipped), in place of prompt
  int64_t batch = 1;        // copies of each prompt decoded together (sequence streams differ)
  int64_t max_new_tokens = 200;
  model::SamplingParams params;
  std::string device = "CPU";  // CPU or CUDA (this process's GPU)
  std::string tokenizer;       // empty: the tokenizer of the run's dataset (data.dir)
  LoadChecks checks;           // what loading the weights checks (train/weights.h)
};
struct Sample {
  std::vector<std::string> prompts;        // one per sequence, in batch order
  std::vector<std::string> continuations;  // the decoded new tokens of each
  int64_t prompt_tokens = 0;               // over all sequences
  std::vector<model::Generation> generations;
};
// Decodes every prompt (batch copies each) as one batch. Throws std::invalid_argument (naming
// the option) on a bad device, batch or prompt file, or a tokenizer whose vocabulary is not the
// model's.
Sample sample_text(const SampleOptions& o);

struct InspectOptions {
  std::string weights;    // as for evaluate_weights
  std::string text;       // encoded, then cut to model.seq_len tokens
  std::string out_dir;    // routing.png, routing.html, routing.csv
  std::string tokenizer;  // empty: the tokenizer of the run's dataset (data.dir)
  LoadChecks checks;      // what loading the weights checks (train/weights.h)
};
struct Inspection {
  std::string title;        // run name, step, tokens
  int64_t text_tokens = 0;  // before the cut to model.seq_len
  model::RoutingTrace trace;
  std::vector<std::string> pieces;  // each token's text
  RoutingReport report;
};
// `modtrain inspect`: where the model's routed blocks send the tokens of `text`.
Inspection inspect_text(const InspectOptions& o);

}  // namespace mod::train
