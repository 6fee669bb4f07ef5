// Evaluation and sampling of a weights file (see inference.h).
#include "train/inference.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "train/data/dataset.h"
#include "train/data/tokenizer.h"
#include "train/trainer.h"
#include "train/weights.h"

namespace mod::train {

namespace {
// The tokenizer a model was trained with (or `path`), checked against the seals of the dataset
// and the weights, and against the model's vocabulary.
std::unique_ptr<data::Tokenizer> tokenizer_for(const LoadedModel& loaded, const std::string& path) {
  data::SealedTokenizer t = path.empty() ? data::load_dataset_tokenizer(loaded.config.data().dir())
                                         : data::load_sealed_tokenizer(path);
  data::check_tokenizer_seal(t.path, t.crc32c, loaded.source, loaded.tokenizer_crc32c);
  if (t.tokenizer->vocab_size() != static_cast<uint32_t>(loaded.config.model().vocab_size()))
    throw std::invalid_argument("--tokenizer " + t.path + ": vocabulary " +
                                std::to_string(t.tokenizer->vocab_size()) + " but the model has " +
                                std::to_string(loaded.config.model().vocab_size()));
  return std::move(t.tokenizer);
}

std::vector<int64_t> encode(const data::Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> ids;
  for (uint32_t t : tok.encode(text)) ids.push_back(t);
  return ids;
}
}  // namespace

WeightsEval evaluate_weights(const std::string& weights, const std::string& data_dir,
                             int64_t batches, int64_t batch_size, const LoadChecks& checks) {
  auto loaded = load_model(weights, checks);
  const auto& cfg = loaded.config;
  WeightsEval r;
  r.name = cfg.name();
  r.step = loaded.step;
  r.data_dir = data_dir.empty() ? cfg.data().dir() : data_dir;
  const auto data = load_dataset(r.data_dir, cfg.model().vocab_size());
  if (data.manifest.has_tokenizer_crc32c())  // Dataset::open checked the file against it
    data::check_tokenizer_seal(data.tokenizer_path(), data.manifest.tokenizer_crc32c(),
                               loaded.source, loaded.tokenizer_crc32c);
  if (batches == 0) batches = cfg.train().eval_batches();
  if (batch_size == 0) batch_size = cfg.train().batch_size();
  const auto top_c = evaluate(*loaded.model, data.val, cfg.model().seq_len(), batch_size, batches,
                              model::RoutingMode::TopC);
  r.tokens = top_c.tokens;
  r.top_c_loss = top_c.loss;
  r.routed = cfg.model().mod().enabled() || cfg.model().moe().enabled();
  if (cfg.model().mod().enabled() &&
      cfg.model().mod().causal().method() == modtrain::CausalRoutingConfig::NONE)
    r.no_causal_loss = "model.mod.causal.method is NONE: the model has no causal routing";
  else if (r.routed)  // MoD and MoE both route non-causally in training
    r.causal_loss = evaluate(*loaded.model, data.val, cfg.model().seq_len(), batch_size, batches,
                             model::RoutingMode::Causal)
                        .loss;
  return r;
}

std::string eval_table(const WeightsEval& r) {
  // Six significant digits, trailing zeros kept (%#): a routing bug can move the loss by 4e-4
  // relative.
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line, "%s (step %lld) on the validation split of %s, %lld tokens\n",
                r.name.c_str(), static_cast<long long>(r.step), r.data_dir.c_str(),
                static_cast<long long>(r.tokens));
  out += line;
  std::snprintf(line, sizeof line, "  validation loss, %s  %#.6g\n",
                r.routed ? "top-C routing (training):" : "dense (no routed blocks):", r.top_c_loss);
  out += line;
  if (r.causal_loss) {
    std::snprintf(line, sizeof line, "  validation loss, causal routing (sampling): %#.6g\n",
                  *r.causal_loss);
    out += line;
  }
  if (!r.no_causal_loss.empty()) out += "  no causal loss: " + r.no_causal_loss + "\n";
  return out;
}

Sample sample_text(const SampleOptions& o) {
  if (o.device != "CPU" && o.device != "CUDA")
    throw std::invalid_argument("--device " + o.device + ": expected CPU or CUDA");
  if (o.batch < 1)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + ": expected at least 1");
  std::vector<std::string> texts{o.prompt};
  if (!o.prompt_file.empty()) {
    std::ifstream in(o.prompt_file);
    if (!in) throw std::invalid_argument("--prompt-file " + o.prompt_file + ": cannot read it");
    texts.clear();
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) texts.push_back(line);
    if (texts.empty())
      throw std::invalid_argument("--prompt-file " + o.prompt_file + ": no prompt (no non-empty line)");
  }
  auto loaded = load_model(o.weights, o.checks);
  if (o.device == "CUDA") loaded.model->to(Device::CUDA);
  const auto tok = tokenizer_for(loaded, o.tokenizer);
  Sample s;
  std::vector<std::vector<int64_t>> ids;
  for (const std::string& text : texts)
    for (int64_t copy = 0; copy < o.batch; ++copy) {
      s.prompts.push_back(text);
      ids.push_back(encode(*tok, text));
      s.prompt_tokens += static_cast<int64_t>(ids.back().size());
    }
  s.generations = model::generate_batch(*loaded.model, ids, o.max_new_tokens, o.params);
  for (const model::Generation& g : s.generations) {
    const std::vector<uint32_t> out(g.tokens.begin(), g.tokens.end());
    s.continuations.push_back(tok->decode(out));
  }
  return s;
}

Inspection inspect_text(const InspectOptions& o) {
  const auto loaded = load_model(o.weights, o.checks);
  const auto tok = tokenizer_for(loaded, o.tokenizer);
  std::vector<int64_t> ids = encode(*tok, o.text);
  if (ids.empty()) throw std::invalid_argument("inspect: the text is empty");
  Inspection in;
  in.text_tokens = static_cast<int64_t>(ids.size());
  ids.resize(std::min<size_t>(ids.size(), loaded.config.model().seq_len()));
  in.trace = model::trace_routing(*loaded.model, ids);
  for (int64_t id : ids) in.pieces.push_back(tok->decode({static_cast<uint32_t>(id)}));
  in.title = loaded.config.name() + " (step " + std::to_string(loaded.step) + "): routing of " +
             std::to_string(ids.size()) + " tokens";
  in.report = write_routing_report(in.trace, in.pieces, in.title, o.out_dir);
  return in;
}

}  // namespace mod::train
