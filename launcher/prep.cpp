// modtrain prep: text -> tokenizer.txt, train.bin, val.bin in --out (train/data/prep.h).
#include "train/data/prep.h"

#include <cstdio>
#include <string>
#include <vector>

#include "launcher/cli.h"

namespace mod::cli {

int prep(int argc, char** argv) {
  po::options_description o("modtrain prep options");
  o.add_options()
      ("out", po::value<std::string>()->required(), "output directory, e.g. data/kjv")
      ("input", po::value<std::vector<std::string>>()->multitoken(), "text files to concatenate")
      ("kjv", po::bool_switch(), "use the King James Bible from Debian's bible-kjv package")
      ("tokenizer", po::value<std::string>()->default_value("byte"), "byte or bpe")
      ("vocab-size", po::value<uint32_t>()->default_value(4096), "BPE vocabulary size (>= 256)")
      ("val-fraction", po::value<double>()->default_value(0.05), "held-out share, in (0, 0.5]");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain prep --out DIR (--kjv | --input FILE...)", o, vm)) return 0;

  data::PrepOptions p;
  p.out = vm["out"].as<std::string>();
  if (vm.count("input")) p.inputs = vm["input"].as<std::vector<std::string>>();
  p.kjv = vm["kjv"].as<bool>();
  p.tokenizer = vm["tokenizer"].as<std::string>();
  p.vocab_size = vm["vocab-size"].as<uint32_t>();
  p.val_fraction = vm["val-fraction"].as<double>();
  const data::PrepResult r = data::prep(p);
  std::printf("prep: %zu bytes -> %s tokenizer (vocab %u) in %.1fs\n  %s/train.bin: %zu tokens\n"
              "  %s/val.bin: %zu tokens\n",
              r.text_bytes, p.tokenizer.c_str(), r.vocab_size, r.seconds, p.out.c_str(),
              r.train_tokens, p.out.c_str(), r.val_tokens);
  return 0;
}

}  // namespace mod::cli
