// modtrain export: a checkpoint (or a run directory's latest) -> one safetensors file of the
// whole model, readable by eval, sample and the Python safetensors package; or (--format hf) a
// model -> a Hugging Face directory that transformers loads (train/hf/export.h).
#include "train/checkpoint/export.h"

#include <cstdio>
#include <stdexcept>

#include "launcher/cli.h"
#include "train/hf/export.h"

namespace mod::cli {

int export_checkpoint(int argc, char** argv) {
  po::options_description o("modtrain export options");
  auto add = o.add_options();
  add("checkpoint", po::value<std::string>()->required(),
      "checkpoint directory, or a run directory (its latest), e.g. runs/tiny_mod; with --format "
      "hf also a weights file (the newer of a run's model.safetensors and latest checkpoint)");
  add("format", po::value<std::string>()->default_value("safetensors"),
      "output format: safetensors (one modtrain file) or hf (a Hugging Face directory)");
  add("out", po::value<std::string>()->required(),
      "output file (safetensors), e.g. runs/tiny_mod/model.safetensors, or directory (hf)");
  add("tokenizer", po::value<std::string>(),
      "hf only: the tokenizer file to write (default: the run's dataset's)");
  po::variables_map vm;
  if (!parse(argc, argv,
             "usage: modtrain export --checkpoint DIR --format safetensors|hf --out FILE|DIR", o,
             vm))
    return 0;
  const std::string format = vm["format"].as<std::string>();
  const std::string out = vm["out"].as<std::string>();
  const std::string from = vm["checkpoint"].as<std::string>();
  if (format == "hf") {
    hf::ExportOptions eo{from, out, vm.count("tokenizer") ? vm["tokenizer"].as<std::string>() : ""};
    const auto s = hf::export_hf(eo);
    std::printf("%s (step %lld): %s, %lld tensors, %.2f MB, %s tokenizer -> %s\n", s.source.c_str(),
                static_cast<long long>(s.step), s.architecture.c_str(),
                static_cast<long long>(s.tensors), s.bytes / 1e6, s.tokenizer_kind.c_str(),
                out.c_str());
    return 0;
  }
  if (format != "safetensors")
    throw std::invalid_argument("--format '" + format +
                                "' is not supported (accepted: safetensors, hf)");
  if (vm.count("tokenizer"))
    throw std::invalid_argument("--tokenizer applies to --format hf only");
  const auto s = ckpt::export_safetensors(from, out);
  std::printf("%s (step %lld): %lld tensors, %.2f MB -> %s\n", s.checkpoint.c_str(),
              static_cast<long long>(s.step), static_cast<long long>(s.tensors), s.bytes / 1e6,
              out.c_str());
  return 0;
}

}  // namespace mod::cli
