// Corpus preparation (see prep.h).
#include "train/data/prep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "train/data/token_file.h"
#include "train/data/tokenizer.h"

namespace mod::data {

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

PrepResult prep(const PrepOptions& o) {
  const std::string& out = o.out;
  const std::string& kind = o.tokenizer;
  const double val_fraction = o.val_fraction;
  if (val_fraction <= 0 || val_fraction > 0.5)
    throw std::invalid_argument("--val-fraction " + std::to_string(val_fraction) +
                                ": expected (0, 0.5]");
  if (kind != "byte" && kind != "bpe")
    throw std::invalid_argument("--tokenizer " + kind + ": expected byte or bpe");
  std::string text;
  if (o.kjv) text = read_kjv();
  for (const auto& f : o.inputs) text += read_file(f);
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
  std::unique_ptr<Tokenizer> tok;
  if (kind == "byte")
    tok = std::make_unique<ByteTokenizer>();
  else
    tok = std::make_unique<BpeTokenizer>(BpeTokenizer::train(train_text, o.vocab_size));
  std::filesystem::create_directories(out);
  tok->save(out + "/tokenizer.txt");
  const auto train_ids = tok->encode(train_text), val_ids = tok->encode(val_text);
  write_shard(out + "/train.bin", train_ids, tok->vocab_size());
  write_shard(out + "/val.bin", val_ids, tok->vocab_size());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {text.size(), tok->vocab_size(), train_ids.size(), val_ids.size(), secs};
}

}  // namespace mod::data
