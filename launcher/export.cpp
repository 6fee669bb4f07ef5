// modtrain export: a checkpoint (or a run directory's latest) -> one safetensors file of the
// whole model, readable by eval, sample and the Python safetensors package.
#include "train/checkpoint/export.h"

#include <cstdio>
#include <stdexcept>

#include "launcher/cli.h"

namespace mod::cli {

int export_checkpoint(int argc, char** argv) {
  po::options_description o("modtrain export options");
  auto add = o.add_options();
  add("checkpoint", po::value<std::string>()->required(),
      "checkpoint directory, or a run directory (its latest), e.g. runs/tiny_mod");
  add("format", po::value<std::string>()->default_value("safetensors"),
      "output format: safetensors");
  add("out", po::value<std::string>()->required(),
      "output file, e.g. runs/tiny_mod/model.safetensors");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain export --checkpoint DIR --format safetensors --out FILE",
             o, vm))
    return 0;
  const std::string format = vm["format"].as<std::string>();
  if (format != "safetensors")
    throw std::invalid_argument("--format '" + format +
                                "' is not supported (accepted: safetensors)");
  const std::string out = vm["out"].as<std::string>();
  const auto s = ckpt::export_safetensors(vm["checkpoint"].as<std::string>(), out);
  std::printf("%s (step %lld): %lld tensors, %.2f MB -> %s\n", s.checkpoint.c_str(),
              static_cast<long long>(s.step), static_cast<long long>(s.tensors), s.bytes / 1e6,
              out.c_str());
  return 0;
}

}  // namespace mod::cli
