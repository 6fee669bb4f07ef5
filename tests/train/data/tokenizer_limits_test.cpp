// Hostile tokenizer files (issue 43): what a tokenizer reads and builds is bounded. Only regular
// files of at most kMaxTokenizerFileBytes are read (never /dev/zero or a FIFO), a tokenizer.json
// nested deeper than the library allows is refused before it is parsed, and a BPE whose merges
// double a token is refused at the line that breaks kMaxTokenBytes or kMaxVocabBytes.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "train/data/hf_tokenizer.h"
#include "train/data/tokenizer.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("modtrain_tok_limits_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// A modtrain BPE file whose merges are given as lines "l r".
std::string bpe_text(const std::vector<std::string>& merges) {
  std::string s = "modtrain-tokenizer 1\nkind bpe\nvocab_size " +
                  std::to_string(256 + merges.size()) + "\nmerges " +
                  std::to_string(merges.size()) + "\n";
  for (const auto& m : merges) s += m + "\n";
  return s;
}

// Token 256 + k holds 2^(k+1) 'a's: merge 0 is "97 97", merge k "255+k 255+k".
std::vector<std::string> doubling_merges(int n) {
  std::vector<std::string> m = {"97 97"};
  for (int k = 1; k < n; ++k) m.push_back(std::to_string(255 + k) + " " + std::to_string(255 + k));
  return m;
}
}  // namespace

TEST_CASE("a BPE whose merges double a token is refused at the line past the bound", "[data]") {
  // 40 self-doubling merges asked for 2^41 bytes (8 GB in 7 s before the bound).
  const std::string text = bpe_text(doubling_merges(40));
  // Merge 11 makes 4096 bytes (allowed); merge 12, on line 17, would make 8192.
  CHECK_THROWS_WITH(
      Tokenizer::parse_text(text, "tok.txt"),
      Contains(
          "tokenizer tok.txt: line 17: merge 267 267 makes a token of 8192 bytes (at most 4096)"));
  const auto ok = Tokenizer::parse_text(bpe_text(doubling_merges(12)), "tok.txt");
  CHECK(ok->decode({256 + 11}) == std::string(4096, 'a'));

  std::vector<std::pair<uint32_t, uint32_t>> merges;
  for (uint32_t k = 0; k < 40; ++k) merges.emplace_back(k ? 255 + k : 97, k ? 255 + k : 97);
  CHECK_THROWS_WITH(BpeTokenizer(merges),
                    Contains("bpe: merge 12 (267, 267) makes a token of 8192 bytes"));
}

TEST_CASE("a BPE whose tokens hold more than kMaxVocabBytes in all is refused", "[data]") {
  // A 2048-byte token T (merge 10), then "T T" again and again: 4096 bytes a token.
  std::vector<std::string> merges = doubling_merges(11);
  const size_t repeats = kMaxVocabBytes / 4096 + 1;
  for (size_t i = 0; i < repeats; ++i) merges.push_back("266 266");
  CHECK_THROWS_WITH(Tokenizer::parse_text(bpe_text(merges), "tok.txt"),
                    Contains("tokenizer tok.txt: line ") && Contains("bytes exceed 64 MiB in all"));
}

TEST_CASE("BPE training never learns a token past kMaxTokenBytes", "[data]") {
  std::string corpus;
  for (int i = 0; i < 4; ++i) corpus += std::string(10000, 'z') + "\n";  // one long pre-token
  const BpeTokenizer bpe = BpeTokenizer::train(corpus, 300);
  CHECK(bpe.vocab_size() > 256);
  for (uint32_t t = 0; t < bpe.vocab_size(); ++t) CHECK(bpe.decode({t}).size() <= kMaxTokenBytes);
  CHECK(bpe.decode(bpe.encode(corpus)) == corpus);
  const fs::path path = temp_dir() / "long.txt";
  bpe.save(path.string());
  CHECK(Tokenizer::load(path.string())->encode(corpus) == bpe.encode(corpus));
  fs::remove_all(path.parent_path());
}

TEST_CASE("tokenizers are read only from regular files of bounded size", "[data]") {
  for (const std::string dev : {"/dev/zero", "/dev/urandom"}) {
    CHECK_THROWS_WITH(Tokenizer::load(dev), Contains("tokenizer " + dev + ": not a regular file"));
    CHECK_THROWS_WITH(HfTokenizer::from_file(dev), Contains(dev + ": not a regular file"));
  }
  const fs::path dir = temp_dir();
  const std::string fifo = (dir / "fifo.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // no writer: an open that waited would hang
  CHECK_THROWS_WITH(Tokenizer::load(fifo), Contains(fifo + ": not a regular file"));
  const fs::path big = dir / "big.txt";
  { std::ofstream(big) << "modtrain-tokenizer 1\n"; }
  fs::resize_file(big, kMaxTokenizerFileBytes + 1);  // sparse: costs no disk
  CHECK_THROWS_WITH(Tokenizer::load(big.string()),
                    Contains(big.string() + ": 67108865 bytes, more than the 64 MiB"));
  CHECK_THROWS_WITH(Tokenizer::load((dir / "missing.txt").string()),
                    Contains("missing.txt: cannot open: No such file"));
  fs::remove_all(dir);
}

TEST_CASE("a tokenizer.json nested 50,000 deep is refused before it is parsed", "[data]") {
  // Before the bound: 9 GB (a path string copied per level), then a crash.
  const std::string open = R"({"type": "Sequence", "pretokenizers": [)";
  std::string json = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": )";
  for (int i = 0; i < 50000; ++i) json += open;
  json += R"({"type": "ByteLevel"})";
  for (int i = 0; i < 50000; ++i) json += "]}";
  json += "}";
  CHECK_THROWS_WITH(HfTokenizer(json, "deep.json"),
                    Contains("deep.json: JSON nests deeper than 128 levels"));
  const std::string brackets(100000, '[');
  CHECK_THROWS_WITH(HfTokenizer(brackets, "brackets.json"),
                    Contains("brackets.json: JSON nests deeper"));
  // Brackets inside strings are text, not nesting.
  CHECK_THROWS_WITH(HfTokenizer("{\"x\": \"" + brackets + "\"}", "s.json"),
                    !Contains("nests deeper"));
}
