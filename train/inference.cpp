// Evaluation and sampling of a weights file (see inference.h).
#include "train/inference.h"

#include <stdexcept>

#include "train/data/tokenizer.h"
#include "train/trainer.h"
#include "train/weights.h"

namespace mod::train {

WeightsEval evaluate_weights(const std::string& weights, const std::string& data_dir,
                             int64_t batches, int64_t batch_size) {
  auto loaded = load_weights(weights);
  const auto& cfg = loaded.config;
  WeightsEval r;
  r.name = cfg.name();
  r.step = loaded.step;
  r.data_dir = data_dir.empty() ? cfg.data().dir() : data_dir;
  const auto data = load_splits(r.data_dir, cfg.model().vocab_size());
  const auto top_c = evaluate(*loaded.model, *data.val, cfg.model().seq_len(), batch_size, batches,
                              model::RoutingMode::TopC);
  r.tokens = top_c.tokens;
  r.top_c_loss = top_c.loss;
  if (cfg.model().mod().enabled() || cfg.model().moe().enabled())  // both route non-causally
    r.causal_loss = evaluate(*loaded.model, *data.val, cfg.model().seq_len(), batch_size, batches,
                             model::RoutingMode::Causal)
                        .loss;
  return r;
}

Sample sample_text(const SampleOptions& o) {
  if (o.device != "CPU" && o.device != "CUDA")
    throw std::invalid_argument("--device " + o.device + ": expected CPU or CUDA");
  auto loaded = load_weights(o.weights);
  if (o.device == "CUDA") loaded.model->to(Device::CUDA);
  const std::string tok_path =
      o.tokenizer.empty() ? loaded.config.data().dir() + "/tokenizer.txt" : o.tokenizer;
  auto tok = data::Tokenizer::load(tok_path);
  if (tok->vocab_size() != static_cast<uint32_t>(loaded.config.model().vocab_size()))
    throw std::invalid_argument("--tokenizer " + tok_path + ": vocabulary " +
                                std::to_string(tok->vocab_size()) + " but the model has " +
                                std::to_string(loaded.config.model().vocab_size()));
  std::vector<int64_t> ids;
  for (uint32_t t : tok->encode(o.prompt)) ids.push_back(t);
  Sample s;
  s.prompt_tokens = static_cast<int64_t>(ids.size());
  s.generation = model::generate(*loaded.model, ids, o.max_new_tokens, o.params);
  const std::vector<uint32_t> out(s.generation.tokens.begin(), s.generation.tokens.end());
  s.continuation = tok->decode(out);
  return s;
}

}  // namespace mod::train
