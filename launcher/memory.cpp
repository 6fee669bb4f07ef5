// modtrain memory: the predicted peak memory per rank of a config (model/memory_plan.h), for its
// parallel layout and a recompute setting, and whether it fits a stated device memory.
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <string>

#include "configs/config.h"
#include "launcher/cli.h"
#include "model/memory_plan.h"
#include "parallel/pipeline_memory.h"
#include "parallel/pipeline_partition.h"

namespace mod::cli {

namespace {
model::Recompute parse_recompute(const std::string& s) {
  model::Recompute mode;
  if (!modtrain::TrainConfig::Recompute_Parse(s, &mode))
    throw std::invalid_argument("--recompute: expected NONE, SELECTIVE or FULL, got '" + s + "'");
  return mode;
}

std::vector<int> parse_blocks(const std::string& s) {
  std::vector<int> out;
  std::istringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    try {
      out.push_back(std::stoi(item));
    } catch (const std::exception&) {
      throw std::invalid_argument("--recompute-blocks: expected block numbers like 0,2,4, got '" +
                                  s + "'");
    }
  }
  return out;
}
}  // namespace

int memory(int argc, char** argv) {
  po::options_description o("modtrain memory options");
  add_config_options(o);
  o.add_options()
      ("recompute", po::value<std::string>(), "activation recomputation: NONE, SELECTIVE or FULL (default: the config's train.recompute)")
      ("recompute-blocks", po::value<std::string>(), "blocks recomputed, e.g. 0,2,4 (default: the config's train.recompute_blocks, else all)")
      ("device-memory-gb", po::value<double>(), "say whether the peak fits this much memory per device, e.g. 80");
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: modtrain memory --config FILE [--set f=v ...] [--recompute NONE|SELECTIVE|FULL] "
             "[--device-memory-gb N]",
             o, vm))
    return 0;
  modtrain::RunConfig cfg = load_config(vm);
  // The options as config fields, so the pipeline table (per rank, from the config) sees them too.
  if (vm.count("recompute"))
    cfg.mutable_train()->set_recompute(parse_recompute(vm["recompute"].as<std::string>()));
  if (vm.count("recompute-blocks")) {
    cfg.mutable_train()->clear_recompute_blocks();
    for (int b : parse_blocks(vm["recompute-blocks"].as<std::string>()))
      cfg.mutable_train()->add_recompute_blocks(b);
  }
  const model::MemoryOptions opt = model::memory_options(cfg);
  const model::MemoryPlan plan = model::plan_memory(cfg.model(), opt);
  std::printf("%s\n%s%s", cfg.name().c_str(), model::describe_memory(plan, opt).c_str(),
              parallel::describe_pipeline(cfg).c_str());
  if (vm.count("device-memory-gb")) {
    const double peak = parallel::predicted_peak(cfg);  // under pp the fullest rank's
    const double limit = vm["device-memory-gb"].as<double>() * 1e9;
    std::printf("%s %.4g GB per device (predicted peak %.4g GB)\n",
                peak <= limit ? "fits" : "DOES NOT FIT", limit / 1e9, peak / 1e9);
  }
  return 0;
}

}  // namespace mod::cli
