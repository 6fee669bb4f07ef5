// modtrain sample: generate text from a trained model with static KV caches, one or more
// sequences decoded as a batch (train/inference.h). Routed blocks admit a token iff its predictor
// (or router) says so; the admitted share per block, summed over the sequences, is reported.
#include <cstdio>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "train/inference.h"

namespace mod::cli {

int sample(int argc, char** argv) {
  po::options_description o("modtrain sample options");
  o.add_options()("checkpoint", po::value<std::string>()->required(), "weights file, checkpoint directory, or run directory, e.g. runs/tiny_mod")
      ("prompt", po::value<std::string>()->default_value("In the beginning"), "text to continue")
      ("prompt-file", po::value<std::string>(), "one prompt a line, decoded as one batch (in place of --prompt)")
      ("batch", po::value<int64_t>()->default_value(1), "copies of each prompt decoded together, e.g. 16 (each its own random stream)")
      ("max-new-tokens", po::value<int64_t>()->default_value(200), "tokens to generate per sequence")
      ("temperature", po::value<double>()->default_value(0.8), "0: greedy")
      ("top-k", po::value<int64_t>()->default_value(0), "keep the k most likely tokens; 0: all")
      ("top-p", po::value<double>()->default_value(0.95), "nucleus probability mass")
      ("seed", po::value<uint64_t>()->default_value(1), "sampling seed")
      ("eot-id", po::value<int64_t>()->default_value(-1), "token id that ends a sequence, e.g. 50256; -1: none")
      ("no-cuda-graph", po::bool_switch(), "on a GPU, launch every step's kernels instead of replaying one captured graph")
      ("device", po::value<std::string>()->default_value("CPU"), "CPU, or CUDA (this process's GPU)")
      ("tokenizer", po::value<std::string>(), "tokenizer file (default: the one of the run's dataset)")
      ("allow-non-finite", po::bool_switch(), "open weights holding NaN or infinities (refused otherwise, naming the tensor)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain sample --checkpoint FILE|DIR [--prompt TEXT | --prompt-file FILE] [--batch B]", o, vm)) return 0;
  train::SampleOptions so;
  so.weights = vm["checkpoint"].as<std::string>();
  so.prompt = vm["prompt"].as<std::string>();
  if (vm.count("prompt-file")) so.prompt_file = vm["prompt-file"].as<std::string>();
  so.batch = vm["batch"].as<int64_t>();
  so.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
  so.params.temperature = vm["temperature"].as<double>();
  so.params.top_k = vm["top-k"].as<int64_t>();
  so.params.top_p = vm["top-p"].as<double>();
  so.params.seed = vm["seed"].as<uint64_t>();
  so.params.eot = vm["eot-id"].as<int64_t>();
  so.params.cuda_graph = !vm["no-cuda-graph"].as<bool>();
  so.device = vm["device"].as<std::string>();
  if (vm.count("tokenizer")) so.tokenizer = vm["tokenizer"].as<std::string>();
  so.checks.allow_non_finite = vm["allow-non-finite"].as<bool>();
  const train::Sample s = train::sample_text(so);
  const size_t n = s.generations.size();
  int64_t generated = 0;
  std::vector<long long> admitted, seen;
  for (size_t i = 0; i < n; ++i) {
    const model::Generation& g = s.generations[i];
    if (n > 1) std::printf("=== sequence %zu ===\n", i);
    std::printf("%s%s\n", s.prompts[i].c_str(), s.continuations[i].c_str());
    generated += static_cast<int64_t>(g.tokens.size());
    admitted.resize(g.admitted.size());
    seen.resize(g.seen.size());
    for (size_t b = 0; b < g.admitted.size(); ++b) {
      admitted[b] += g.admitted[b];
      seen[b] += g.seen[b];
    }
  }
  const double seconds = s.generations.front().seconds;
  std::fprintf(stderr, "\n[%lld tokens in %.2fs, %.1f tokens/s over %zu sequence%s",
               static_cast<long long>(generated), seconds, (s.prompt_tokens + generated) / seconds,
               n, n == 1 ? "" : "s");
  for (size_t b = 0; b < admitted.size(); ++b)
    std::fprintf(stderr, "; routed block admitted %lld/%lld", admitted[b], seen[b]);
  std::fprintf(stderr, "]\n");
  return 0;
}

}  // namespace mod::cli
