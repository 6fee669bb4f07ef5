// modtrain prep: text -> tokenizer.txt, train.bin, val.bin in --out. Every k-th 64 KiB block of
// text (k = 1 / val-fraction) is held out for validation, so both splits span the corpus; the
// BPE tokenizer is trained on the training split only.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "launcher/cli.h"
#include "train/data/shard.h"
#include "train/data/tokenizer.h"

namespace mod::cli {

namespace {
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--input " + path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_kjv() {
  FILE* p = popen("bible Gen1:1-Rev22:21 2>/dev/null", "r");
  if (!p) throw std::runtime_error("--kjv: cannot run `bible` (install Debian's bible-kjv)");
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int status = pclose(p);
  if (status != 0 || text.size() < 1000000)
    throw std::runtime_error("--kjv: `bible Gen1:1-Rev22:21` failed or printed only " +
                             std::to_string(text.size()) + " bytes (install Debian's bible-kjv)");
  return text;
}
}  // namespace

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

  const std::string out = vm["out"].as<std::string>(), kind = vm["tokenizer"].as<std::string>();
  const double val_fraction = vm["val-fraction"].as<double>();
  if (val_fraction <= 0 || val_fraction > 0.5)
    throw std::invalid_argument("--val-fraction " + std::to_string(val_fraction) + ": expected (0, 0.5]");
  if (kind != "byte" && kind != "bpe")
    throw std::invalid_argument("--tokenizer " + kind + ": expected byte or bpe");
  std::string text;
  if (vm["kjv"].as<bool>()) text = read_kjv();
  if (vm.count("input"))
    for (const auto& f : vm["input"].as<std::vector<std::string>>()) text += read_file(f);
  if (text.empty()) throw std::invalid_argument("no text: give --kjv or --input FILE...");

  constexpr size_t kBlock = 64 * 1024;
  const size_t every = static_cast<size_t>(std::max(2.0, std::round(1.0 / val_fraction)));
  std::string train_text, val_text;
  for (size_t i = 0, block = 0; i < text.size(); i += kBlock, ++block)
    (block % every == every - 1 ? val_text : train_text) += text.substr(i, kBlock);
  if (val_text.empty()) {  // a short corpus: hold out its tail
    const size_t cut = static_cast<size_t>(text.size() * (1 - val_fraction));
    train_text = text.substr(0, cut);
    val_text = text.substr(cut);
  }

  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<data::Tokenizer> tok;
  if (kind == "byte")
    tok = std::make_unique<data::ByteTokenizer>();
  else
    tok = std::make_unique<data::BpeTokenizer>(
        data::BpeTokenizer::train(train_text, vm["vocab-size"].as<uint32_t>()));
  std::filesystem::create_directories(out);
  tok->save(out + "/tokenizer.txt");
  const auto train_ids = tok->encode(train_text), val_ids = tok->encode(val_text);
  data::write_shard(out + "/train.bin", train_ids, tok->vocab_size());
  data::write_shard(out + "/val.bin", val_ids, tok->vocab_size());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("prep: %zu bytes -> %s tokenizer (vocab %u) in %.1fs\n  %s/train.bin: %zu tokens\n"
              "  %s/val.bin: %zu tokens\n",
              text.size(), kind.c_str(), tok->vocab_size(), secs, out.c_str(), train_ids.size(),
              out.c_str(), val_ids.size());
  return 0;
}

}  // namespace mod::cli
