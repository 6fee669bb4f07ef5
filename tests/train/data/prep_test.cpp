// Corpus preparation: every k-th 64 KiB block goes to validation (k = 1 / val_fraction), a short
// corpus holds out its tail, the shards hold the text's tokens, and bad options are named.
#include "train/data/prep.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "train/data/token_file.h"
#include "train/data/tokenizer.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
std::string write_text(const fs::path& dir, const std::string& text) {
  fs::create_directories(dir);
  const std::string path = (dir / "corpus.txt").string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}
std::string tokens_text(const std::string& shard) {
  std::string s;
  for (uint32_t t : read_all(TokenFile::open(shard, modtrain::data::MODTRAIN, 0))) s += static_cast<char>(t);
  return s;
}
}  // namespace

TEST_CASE("prep holds out every k-th block, or a short corpus's tail", "[data]") {
  const fs::path dir = fs::temp_directory_path() / ("modtrain_prep_" + std::to_string(::getpid()));
  constexpr size_t kBlock = 64 * 1024;
  std::string text;
  for (char c : {'a', 'b', 'c', 'd'}) text += std::string(kBlock, c);
  text += "tail";
  PrepOptions o;
  o.out = (dir / "blocks").string();
  o.inputs = {write_text(dir, text)};
  o.val_fraction = 0.5;  // every 2nd block
  const PrepResult r = prep(o);
  CHECK(r.text_bytes == text.size());
  CHECK(r.vocab_size == 256);
  CHECK(tokens_text(o.out + "/train.bin") ==
        std::string(kBlock, 'a') + std::string(kBlock, 'c') + "tail");
  CHECK(tokens_text(o.out + "/val.bin") == std::string(kBlock, 'b') + std::string(kBlock, 'd'));
  CHECK(Tokenizer::load(o.out + "/tokenizer.txt")->kind() == "byte");

  o.out = (dir / "short").string();
  o.inputs = {write_text(dir, "0123456789")};
  const PrepResult s = prep(o);  // one block, kept for training: its second half is held out
  CHECK(s.train_tokens == 5);
  CHECK(tokens_text(o.out + "/val.bin") == "56789");

  o.val_fraction = 0.6;
  CHECK_THROWS_WITH(prep(o), Contains("--val-fraction"));
  o.val_fraction = 0.5;
  o.tokenizer = "words";
  CHECK_THROWS_WITH(prep(o), Contains("--tokenizer words"));
  o.tokenizer = "byte";
  o.inputs.clear();
  CHECK_THROWS_WITH(prep(o), Contains("no text"));
  fs::remove_all(dir);
}
