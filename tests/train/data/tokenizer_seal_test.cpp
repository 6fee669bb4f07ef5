// Tokenizer seals (train/data/tokenizer_seal.h): prep records the CRC-32C of the tokenizer file
// it wrote in the manifest; a tokenizer file changed by one bit afterwards is refused wherever
// the dataset or its tokenizer is opened, naming both files and both CRCs; a manifest older than
// the seal opens without a check.
#include "train/data/tokenizer_seal.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>

#include "core/util/crc32c.h"
#include "train/data/dataset.h"
#include "train/data/prep.h"
#include "tests/support/errors.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

using mod::test::error_of;
using mod::test::write_bytes;

namespace {
fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("modtrain_tok_seal_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}


// A BPE dataset prepared from a small text: its directory.
fs::path prepared_bpe(const fs::path& dir) {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "the light and the darkness, day " + std::to_string(i % 7) + ".\n";
  write_all(dir / "corpus.txt", text);
  PrepOptions o;
  o.inputs = {(dir / "corpus.txt").string()};
  o.out = (dir / "data").string();
  o.tokenizer = "bpe";
  o.vocab_size = 300;
  o.text_chunk_kb = 1;
  o.progress = false;
  prep(o);
  return dir / "data";
}
}  // namespace

TEST_CASE("prep seals its tokenizer, and a one-bit change is refused naming both files", "[data]") {
  const fs::path dir = temp_dir(), data = prepared_bpe(dir);
  const fs::path tok = data / "tokenizer.txt", manifest = data / kManifestName;
  const std::string bytes = read_all(tok);
  const uint32_t sealed = mod::crc32c(bytes.data(), bytes.size());
  const uint32_t vocab = Tokenizer::load(tok.string())->vocab_size();
  REQUIRE(read_manifest(manifest.string()).tokenizer_crc32c() == sealed);
  CHECK_NOTHROW(Dataset::open(data.string()));
  CHECK(load_dataset_tokenizer(data.string()).crc32c == sealed);

  // Line 5 is merge 0, of two bytes: flipping the low bit of its last digit keeps it valid.
  std::string flipped = bytes;
  size_t at = 0;
  for (int line = 1; line < 6; ++line) at = flipped.find('\n', at) + 1;
  flipped[at - 2] ^= 1;
  write_all(tok, flipped);
  const std::string now = mod::crc32c_text(mod::crc32c(flipped.data(), flipped.size()));
  REQUIRE(Tokenizer::load(tok.string())->vocab_size() == vocab);  // a valid, different tokenizer
  for (const std::string& error : {error_of([&] { Dataset::open(data.string()); }),
                                   error_of([&] { load_dataset_tokenizer(data.string()); })}) {
    CHECK_THAT(error, Contains("tokenizer " + tok.string() + " has CRC-32C " + now));
    CHECK_THAT(error, Contains("dataset " + manifest.string() + " was made with one of CRC-32C " +
                               mod::crc32c_text(sealed)));
  }

  // A manifest older than the seal opens unchecked.
  const std::string text = read_all(manifest);
  write_all(manifest, std::regex_replace(text, std::regex("tokenizer_crc32c: [0-9]+\n"), ""));
  CHECK_FALSE(read_manifest(manifest.string()).has_tokenizer_crc32c());
  CHECK_NOTHROW(Dataset::open(data.string()));
  CHECK_NOTHROW(load_dataset_tokenizer(data.string()));
  fs::remove_all(dir);
}

TEST_CASE("tokenizer seals check only when recorded, and parse strictly", "[data]") {
  CHECK_NOTHROW(check_tokenizer_seal("t.json", 7, "weights w", std::nullopt));
  CHECK_NOTHROW(check_tokenizer_seal("t.json", 7, "weights w", 7u));
  CHECK_THROWS_WITH(check_tokenizer_seal("t.json", 7, "weights w", 8u),
                    Contains("tokenizer t.json has CRC-32C 00000007, but weights w was made with "
                             "one of CRC-32C 00000008"));
  CHECK(mod::crc32c_text(0x1c9be0a1u) == "1c9be0a1");
  CHECK(mod::parse_crc32c_text("1c9be0a1", "w") == 0x1c9be0a1u);
  for (const std::string bad : {"", "1c9be0a", "1C9BE0A1", "1c9be0a1 ", "-c9be0a1", "0x9be0a1"})
    CHECK_THROWS_WITH(mod::parse_crc32c_text(bad, "weights w: metadata tokenizer_crc32c"),
                      Contains("weights w: metadata tokenizer_crc32c: '"));
}
