// Tokenizers and token shards: lossless round trips, deterministic BPE training, and errors
// that name the file for corrupt input.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "train/data/token_file.h"
#include "train/data/tokenizer.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
const std::string kText =
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
    "And the Spirit of God moved upon the face of the waters.  12:3 \xC3\xA9t\xC3\xA9\n\n";

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("modtrain_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}
}  // namespace

TEST_CASE("pre-tokens concatenate back to the text", "[data]") {
  std::string joined;
  for (auto w : pretokenize(kText)) joined += w;
  CHECK(joined == kText);
  auto words = pretokenize("the earth  was\n\nvoid;");
  CHECK(std::vector<std::string_view>(words.begin(), words.end()) ==
        std::vector<std::string_view>{"the", " earth", " ", " was", "\n\n", "void", ";"});
}

TEST_CASE("byte tokenizer round-trips any bytes", "[data]") {
  ByteTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  CHECK(t.decode(t.encode(all)) == all);
  CHECK(t.encode("A")[0] == 65);
}

TEST_CASE("BPE learns merges, compresses, round-trips and is deterministic", "[data]") {
  std::string corpus;
  for (int i = 0; i < 20; ++i) corpus += kText;
  BpeTokenizer a = BpeTokenizer::train(corpus, 300), b = BpeTokenizer::train(corpus, 300);
  CHECK(a.vocab_size() == 300);
  CHECK(a.merges() == b.merges());
  const auto ids = a.encode(kText);
  CHECK(ids.size() < kText.size() / 2);
  CHECK(a.decode(ids) == kText);
  CHECK(a.decode(a.encode("unseen words: zebra 987")) == "unseen words: zebra 987");
  // The most frequent pair in this corpus is merged first.
  CHECK(a.decode({256}).size() == 2);

  const fs::path path = temp_dir() / "tok.txt";
  a.save(path.string());
  auto loaded = Tokenizer::load(path.string());
  CHECK(loaded->kind() == "bpe");
  CHECK(loaded->encode(kText) == ids);
}

TEST_CASE("token shards round-trip and reject corrupt files naming them", "[data]") {
  const fs::path dir = temp_dir();
  const std::string small = (dir / "small.bin").string(), wide = (dir / "wide.bin").string();
  const auto open = [](const std::string& p) { return TokenFile::open(p, modtrain::data::MODTRAIN, 0); };
  std::vector<uint32_t> tokens = {0, 5, 255, 17, 3};
  write_shard(small, tokens, 256);
  CHECK(read_all(open(small)) == tokens);
  CHECK(open(small).width() == 2);
  CHECK(open(small).vocab_size() == 256);
  std::vector<uint32_t> big = {70000, 1, 99999};
  write_shard(wide, big, 100000);
  CHECK(read_all(open(wide)) == big);
  CHECK(open(wide).width() == 4);

  CHECK_THROWS_WITH(write_shard(small, {300}, 256), Contains("small.bin") && Contains("300"));
  fs::resize_file(small, fs::file_size(small) - 1);
  CHECK_THROWS_WITH(open(small), Contains("small.bin") && Contains("truncated"));
  {
    std::ofstream f(small, std::ios::binary | std::ios::trunc);
    f << "NOTASHARD-------------------------------";
  }
  CHECK_THROWS_WITH(open(small), Contains("small.bin") && Contains("magic"));
  CHECK_THROWS_WITH(open((dir / "missing.bin").string()), Contains("missing.bin"));
  {
    std::ofstream f(dir / "bad_tok.txt");
    f << "modtrain-tokenizer 1\nkind bpe\nvocab_size 258\nmerges 2\n1 2\n";
  }
  CHECK_THROWS_WITH(Tokenizer::load((dir / "bad_tok.txt").string()),
                    Contains("bad_tok.txt") && Contains("line 6"));
  fs::remove_all(dir);
}
