// modtrain sample: generate text from a trained model with a KV cache (train/inference.h).
// Routed blocks admit a token iff its predictor (or router) says so; the admitted share per
// block is reported.
#include <cstdio>
#include <string>

#include "launcher/cli.h"
#include "train/inference.h"

namespace mod::cli {

int sample(int argc, char** argv) {
  po::options_description o("modtrain sample options");
  o.add_options()("checkpoint", po::value<std::string>()->required(), "weights file, checkpoint directory, or run directory, e.g. runs/tiny_mod")
      ("prompt", po::value<std::string>()->default_value("In the beginning"), "text to continue")
      ("max-new-tokens", po::value<int64_t>()->default_value(200), "tokens to generate")
      ("temperature", po::value<double>()->default_value(0.8), "0: greedy")
      ("top-k", po::value<int64_t>()->default_value(0), "keep the k most likely tokens; 0: all")
      ("top-p", po::value<double>()->default_value(0.95), "nucleus probability mass")
      ("seed", po::value<uint64_t>()->default_value(1), "sampling seed")
      ("device", po::value<std::string>()->default_value("CPU"), "CPU, or CUDA (this process's GPU)")
      ("tokenizer", po::value<std::string>(), "tokenizer file (default: the one of the run's dataset)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain sample --checkpoint FILE|DIR [--prompt TEXT]", o, vm)) return 0;
  train::SampleOptions so;
  so.weights = vm["checkpoint"].as<std::string>();
  so.prompt = vm["prompt"].as<std::string>();
  so.max_new_tokens = vm["max-new-tokens"].as<int64_t>();
  so.params.temperature = vm["temperature"].as<double>();
  so.params.top_k = vm["top-k"].as<int64_t>();
  so.params.top_p = vm["top-p"].as<double>();
  so.params.seed = vm["seed"].as<uint64_t>();
  so.device = vm["device"].as<std::string>();
  if (vm.count("tokenizer")) so.tokenizer = vm["tokenizer"].as<std::string>();
  const train::Sample s = train::sample_text(so);
  const model::Generation& g = s.generation;
  std::printf("%s%s\n", so.prompt.c_str(), s.continuation.c_str());
  std::fprintf(stderr, "\n[%zu tokens in %.2fs, %.1f tokens/s", g.tokens.size(), g.seconds,
               (s.prompt_tokens + g.tokens.size()) / g.seconds);
  for (size_t i = 0; i < g.admitted.size(); ++i)
    std::fprintf(stderr, "; routed block admitted %lld/%lld", static_cast<long long>(g.admitted[i]),
                 static_cast<long long>(g.seen[i]));
  std::fprintf(stderr, "]\n");
  return 0;
}

}  // namespace mod::cli
