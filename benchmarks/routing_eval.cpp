// routing_eval: validation loss of trained weights files with training-time routing (MoD top-C,
// MoE expert or token choice over the whole sequence) and with causal routing (each token
// decides from its own input: MoD's predictor, MoE's per-token top-k among the experts and the
// no-op), for every model with any routing. benchmarks/equal_flops.sh reads its lines.
// `modtrain eval` prints the causal figure for MoD models only, and expert choice looks at the
// whole sequence as MoD's top-C does, so an MoE model's training-time loss alone flatters it.
//   ./build/benchmarks/routing_eval --data data/kjv --batches 16 runs/a/model.safetensors ...
// Prints per file, as `modtrain eval` does:
//   tiny_moe (step 300) on the validation split of data/kjv, 32768 tokens
//     validation loss, top-C routing (training):  1.2345
//     validation loss, causal routing (sampling): 1.2456       (routed models only)
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/cli.h"
#include "train/trainer.h"
#include "train/weights.h"

using namespace mod;
namespace po = cli::po;

int main(int argc, char** argv) {
  po::options_description o("routing_eval options");
  o.add_options()("data", po::value<std::string>(),
                  "token shard directory (default: each run's data.dir)")(
      "batches", po::value<int64_t>()->default_value(16), "validation batches")(
      "batch-size", po::value<int64_t>()->default_value(8), "sequences per batch")(
      "weights", po::value<std::vector<std::string>>()->composing(),
      "model.safetensors files (also positional)");
  po::positional_options_description pos;
  pos.add("weights", -1);
  po::variables_map vm;
  const char* usage = "usage: routing_eval [--data DIR] [--batches N] FILE.safetensors ...";
  try {
    if (!cli::parse(argc, argv, usage, o, vm, &pos)) return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "routing_eval: %s\n", e.what());
    return 2;
  }
  if (!vm.count("weights")) {
    std::cout << usage << "\n" << o << "\n";
    return 2;
  }
  try {
    const int64_t batches = vm["batches"].as<int64_t>(), bs = vm["batch-size"].as<int64_t>();
    for (const std::string& path : vm["weights"].as<std::vector<std::string>>()) {
      const auto loaded = train::load_weights(path);
      const auto& cfg = loaded.config;
      const std::string dir = vm.count("data") ? vm["data"].as<std::string>() : cfg.data().dir();
      const auto data = train::load_dataset(dir, cfg.model().vocab_size());
      const auto top_c = train::evaluate(*loaded.model, data.val, cfg.model().seq_len(), bs,
                                         batches, model::RoutingMode::TopC);
      std::printf("%s (step %lld) on the validation split of %s, %lld tokens\n", cfg.name().c_str(),
                  static_cast<long long>(loaded.step), dir.c_str(),
                  static_cast<long long>(top_c.tokens));
      std::printf("  validation loss, top-C routing (training):  %.4f\n", top_c.loss);
      if (cfg.model().mod().enabled() || cfg.model().moe().enabled()) {
        const auto causal = train::evaluate(*loaded.model, data.val, cfg.model().seq_len(), bs,
                                            batches, model::RoutingMode::Causal);
        std::printf("  validation loss, causal routing (sampling): %.4f\n", causal.loss);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "routing_eval: %s\n", e.what());
    return 1;
  }
  return 0;
}
