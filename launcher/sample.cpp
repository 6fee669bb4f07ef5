// modtrain sample: generate text from a trained model with a KV cache. Routed blocks admit a
// token iff its predictor (or router) says so; the admitted share per block is reported.
#include <cstdio>
#include <filesystem>

#include "launcher/cli.h"
#include "model/sampler.h"
#include "train/data/tokenizer.h"
#include "train/weights.h"

namespace mod::cli {

int sample(int argc, char** argv) {
  po::options_description o("modtrain sample options");
  o.add_options()("checkpoint", po::value<std::string>()->required(), "weights file, e.g. runs/tiny_mod/model.safetensors")
      ("prompt", po::value<std::string>()->default_value("In the beginning"), "text to continue")
      ("max-new-tokens", po::value<int64_t>()->default_value(200), "tokens to generate")
      ("temperature", po::value<double>()->default_value(0.8), "0: greedy")
      ("top-k", po::value<int64_t>()->default_value(0), "keep the k most likely tokens; 0: all")
      ("top-p", po::value<double>()->default_value(0.95), "nucleus probability mass")
      ("seed", po::value<uint64_t>()->default_value(1), "sampling seed")
      ("device", po::value<std::string>()->default_value("CPU"), "CPU, or CUDA (this process's GPU)")
      ("tokenizer", po::value<std::string>(), "tokenizer file (default: <data.dir>/tokenizer.txt)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain sample --checkpoint FILE [--prompt TEXT]", o, vm)) return 0;
  const std::string device = vm["device"].as<std::string>();
  if (device != "CPU" && device != "CUDA")
    throw std::invalid_argument("--device " + device + ": expected CPU or CUDA");
  auto loaded = train::load_weights(vm["checkpoint"].as<std::string>());
  if (device == "CUDA") loaded.model->to(Device::CUDA);
  const std::string tok_path = vm.count("tokenizer") ? vm["tokenizer"].as<std::string>()
                                                     : loaded.config.data().dir() + "/tokenizer.txt";
  auto tok = data::Tokenizer::load(tok_path);
  if (tok->vocab_size() != static_cast<uint32_t>(loaded.config.model().vocab_size()))
    throw std::invalid_argument("--tokenizer " + tok_path + ": vocabulary " +
                                std::to_string(tok->vocab_size()) + " but the model has " +
                                std::to_string(loaded.config.model().vocab_size()));
  const std::string prompt = vm["prompt"].as<std::string>();
  std::vector<int64_t> ids;
  for (uint32_t t : tok->encode(prompt)) ids.push_back(t);
  model::SamplingParams p;
  p.temperature = vm["temperature"].as<double>();
  p.top_k = vm["top-k"].as<int64_t>();
  p.top_p = vm["top-p"].as<double>();
  p.seed = vm["seed"].as<uint64_t>();
  const auto g = model::generate(*loaded.model, ids, vm["max-new-tokens"].as<int64_t>(), p);
  std::vector<uint32_t> out(g.tokens.begin(), g.tokens.end());
  std::printf("%s%s\n", prompt.c_str(), tok->decode(out).c_str());
  std::fprintf(stderr, "\n[%zu tokens in %.2fs, %.1f tokens/s", g.tokens.size(), g.seconds,
               (ids.size() + g.tokens.size()) / g.seconds);
  for (size_t i = 0; i < g.admitted.size(); ++i)
    std::fprintf(stderr, "; routed block admitted %lld/%lld", static_cast<long long>(g.admitted[i]),
                 static_cast<long long>(g.seen[i]));
  std::fprintf(stderr, "]\n");
  return 0;
}

}  // namespace mod::cli
