// HfTokenizer on small hand-written tokenizer.json files: known ids, added tokens split out
// with lstrip/rstrip, refusals that name the JSON field, invalid UTF-8 replaced as Python does,
// and equal results from several threads. Parity with the `tokenizers` library on real text is
// tests/train/data/hf_parity.py.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "train/data/hf_tokenizer.h"
#include "train/data/unicode.h"

using namespace mod::data;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("modtrain_hf_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

// GPT-2's byte -> character map, written out here independently of the tokenizer's.
std::string byte_char(int b) {
  const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  int cp = b;
  if (!printable) {
    int n = 0;
    for (int k = 0; k < b; ++k)
      if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || k >= 174)) ++n;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) s += static_cast<char>(cp);
  else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += static_cast<char>(c);
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out;
}

// Byte b has id b; then "Ġt" 256, "he" 257, "Ġthe" 258 from three merges; added tokens
// <|endoftext|> 259 and <pad> 260 (lstrip, rstrip).
const char* const kGpt2Pre =
    R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})";

std::string tokenizer_json(const std::string& pre_tokenizer = kGpt2Pre,
                           const std::string& normalizer = "null",
                           const std::string& model_type = "BPE",
                           const std::string& pad_extra = "\"single_word\": false",
                           const std::string& merges =
                               R"([["\u0120", "t"], ["h", "e"], ["\u0120t", "he"]])") {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    vocab += '"';
    vocab += json_escape(byte_char(b));
    vocab += "\": ";
    vocab += std::to_string(b);
    vocab += ", ";
  }
  vocab += "\"\xC4\xA0t\": 256, \"he\": 257, \"\xC4\xA0the\": 258";
  return R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 259, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
     "rstrip": false, "normalized": false, "special": true},
    {"id": 260, "content": "<pad>", )" + pad_extra + R"(, "lstrip": true, "rstrip": true,
     "normalized": false, "special": true}],
  "normalizer": )" + normalizer + R"(,
  "pre_tokenizer": )" + pre_tokenizer + R"(,
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": ")" + model_type + R"(", "dropout": null, "unk_token": null,
    "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
    "byte_fallback": false, "ignore_merges": false,
    "vocab": {)" + vocab + R"(},
    "merges": )" + merges + R"(}})";
}

HfTokenizer make(const std::string& text) { return HfTokenizer(text, "tokenizer.json"); }
using Ids = std::vector<uint32_t>;
}  // namespace

TEST_CASE("hf tokenizer encodes known ids and decodes them back", "[data]") {
  const HfTokenizer tok = make(tokenizer_json());
  CHECK(tok.kind() == "hf");
  CHECK(tok.vocab_size() == 261);
  CHECK(tok.encode("the") == Ids{'t', 257});
  CHECK(tok.encode(" the") == Ids{258});
  CHECK(tok.encode("the the") == Ids{'t', 257, 258});
  CHECK(tok.encode("").empty());
  CHECK(tok.encode("a\n\n b") == Ids{'a', '\n', '\n', ' ', 'b'});  // "a" "\n\n" " b"
  for (const std::string s : {"the the", "\t x  yz 12 !!", "caf\xC3\xA9 \xF0\x9F\x91\x8D"})
    CHECK(tok.decode(tok.encode(s)) == s);
  CHECK_THROWS_WITH(tok.decode({261}), Contains("token id 261"));
}

TEST_CASE("hf tokenizer splits out added tokens, lstrip and rstrip taking whitespace", "[data]") {
  const HfTokenizer tok = make(tokenizer_json());
  CHECK(tok.encode("a<|endoftext|> the") == Ids{'a', 259, 258});
  CHECK(tok.encode("x <pad>  y") == Ids{'x', 260, 'y'});
  CHECK(tok.encode("<pad><|endoftext|><|endoftext|>") == Ids{260, 259, 259});
  CHECK(tok.encode("<|endoftext") == Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't'});
  CHECK(tok.special_token("<|endoftext|>") == 259u);
  CHECK(tok.special_token("<pad>") == 260u);
  CHECK_FALSE(tok.special_token("the").has_value());
  CHECK(tok.decode({'a', 259, 258}) == "a<|endoftext|> the");
}

TEST_CASE("hf tokenizer replaces invalid UTF-8 as Python's errors='replace' does", "[data]") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(replace_invalid_utf8("a\xFF" "b") == "a" + r + "b");
  CHECK(replace_invalid_utf8("\xE2\x82") == r);                     // truncated: one
  CHECK(replace_invalid_utf8("\xF0\x9F\x98x") == r + "x");
  CHECK(replace_invalid_utf8("\xED\xA0\x80") == r + r + r);         // surrogate: each byte
  CHECK(replace_invalid_utf8("\xC0\xAF") == r + r);                 // overlong
  CHECK(replace_invalid_utf8("\xF4\x90\x80\x80") == r + r + r + r);  // above U+10FFFF
  CHECK(replace_invalid_utf8("\xE0\x80\x80") == r + r + r);
  CHECK(replace_invalid_utf8("ok \xC3\xA9") == "ok \xC3\xA9");
  const HfTokenizer tok = make(tokenizer_json());
  CHECK(tok.encode("a\xFF" "b") == Ids{'a', 0xEF, 0xBF, 0xBD, 'b'});
  CHECK(tok.encode("a\xFF" "b") == tok.encode("a" + r + "b"));
}

TEST_CASE("hf tokenizer refuses what it cannot reproduce, naming the JSON field", "[data]") {
  auto refuses = [](const std::string& text, const std::string& what) {
    CHECK_THROWS_WITH(make(text), Contains("tokenizer.json: ") && Contains(what));
  };
  refuses(tokenizer_json(kGpt2Pre, R"({"type": "NFKC"})"),
          "normalizer.type \"NFKC\" is not supported (supported: null)");
  refuses(tokenizer_json(kGpt2Pre, "null", "WordPiece"),
          "model.type \"WordPiece\" is not supported (supported: BPE)");
  refuses(tokenizer_json(kGpt2Pre, "null", "Unigram"), "model.type \"Unigram\"");
  refuses(tokenizer_json(R"({"type": "Metaspace", "replacement": "_"})"),
          "pre_tokenizer.type \"Metaspace\" is not supported");
  refuses(tokenizer_json(R"({"type": "Sequence", "pretokenizers": [{"type": "Split",
          "pattern": {"Regex": "a"}, "behavior": "Contiguous", "invert": false}, )" +
                         std::string(kGpt2Pre) + "]}"),
          "pre_tokenizer.pretokenizers[0].behavior \"Contiguous\"");
  refuses(tokenizer_json(kGpt2Pre, "null", "BPE", "\"single_word\": true"),
          "added_tokens[1].single_word");
  refuses("{\"model\": {\"type\": \"BPE\",", "malformed JSON");
  refuses("{\"pre_tokenizer\": " + std::string(kGpt2Pre) + "}", "missing field model");
  CHECK(make(tokenizer_json(kGpt2Pre, R"({"type": "Sequence", "normalizers": []})"))
            .encode(" the") == Ids{258});
}

TEST_CASE("hf tokenizer loads through Tokenizer::load and saves the JSON unchanged", "[data]") {
  const fs::path dir = temp_dir();
  const std::string text = tokenizer_json();
  for (const std::string name : {"tok.json", "tok.txt"}) {  // by name, or by its first '{'
    { std::ofstream(dir / name) << "  " << text; }
    auto tok = Tokenizer::load((dir / name).string());
    CHECK(tok->kind() == "hf");
    CHECK(tok->encode(" the") == Ids{258});
    CHECK(tok->special_token("<|endoftext|>") == 259u);
    tok->save((dir / "saved.json").string());
    std::ifstream in(dir / "saved.json");
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "  " + text);
  }
  { std::ofstream(dir / "bad.json") << "{\"model\": 3}"; }
  CHECK_THROWS_WITH(Tokenizer::load((dir / "bad.json").string()),
                    Contains((dir / "bad.json").string()));
  fs::remove_all(dir);
}

TEST_CASE("hf tokenizer gives the same ids from several threads at once", "[data]") {
  const HfTokenizer tok = make(tokenizer_json());
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) {
    std::string s;
    for (int k = 0; k < 200; ++k)
      s += (k + i) % 7 == 0 ? " <pad> " : (k % 3 == 0 ? " the" : " them" + std::to_string(k * i));
    texts.push_back(s);
  }
  std::vector<Ids> expected;
  for (const auto& s : texts) expected.push_back(tok.encode(s));
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 50; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (tok.encode(texts[(i + t) % texts.size()]) != expected[(i + t) % texts.size()])
            ++mismatches[t];
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("hf tokenizer reads merges of one form, and refuses what the library refuses", "[data]") {
  const HfTokenizer strings = make(tokenizer_json(kGpt2Pre, "null", "BPE", "\"single_word\": false",
                                                  R"(["\u0120 t", "h e", "\u0120t he"])"));
  CHECK(strings.encode(" the") == Ids{258});
  // The library (tokenizers 0.23) refuses each of these files; a file it cannot load would
  // tokenize a dataset no other tool can reproduce (tests/fuzz/hf_tokenizer_oracle.py).
  CHECK_THROWS_WITH(make(tokenizer_json(kGpt2Pre, "null", "BPE", "\"single_word\": false",
                                        R"([["\u0120", "t"], "h e", ["\u0120t", "he"]])")),
                    Contains("tokenizer.json: model.merges[1] is a string but model.merges[0] is not"));
  std::string extra = tokenizer_json();
  extra.insert(1, R"("runs": "aaaa", )");
  CHECK_THROWS_WITH(make(extra), Contains("tokenizer.json: unknown top-level field \"runs\""));
  std::string version = tokenizer_json();
  version.replace(version.find("\"1.0\""), 5, "\"2.0\"");
  CHECK_THROWS_WITH(make(version), Contains("tokenizer.json: version \"2.0\" is not supported"));
  std::string post = tokenizer_json();
  post.replace(post.find("\"post_processor\": null"), 22, "\"post_processor\": 7");
  CHECK_THROWS_WITH(make(post), Contains("tokenizer.json: post_processor must be an object"));
}

namespace {
// A Sequence of `split` then GPT-2's ByteLevel.
std::string split_then_byte_level(const std::string& regex) {
  return R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": ")" +
         json_escape(regex) + R"("}, "behavior": "Isolated", "invert": false}, )" + kGpt2Pre + "]}";
}
}  // namespace

TEST_CASE("hf tokenizer refuses pre-tokenizer Sequences that encode could not run", "[data]") {
  // An empty Sequence crashed prep and sample at the first encode (no step to run).
  CHECK_THROWS_WITH(make(tokenizer_json(R"({"type": "Sequence", "pretokenizers": []})")),
                    Contains("tokenizer.json: pre_tokenizer: no steps is not supported"));
  // Nested 40 deep (80 JSON levels, under the JSON bound): encode would recurse per level.
  std::string nested = kGpt2Pre;
  for (int i = 0; i < 40; ++i)
    nested = R"({"type": "Sequence", "pretokenizers": [)" + nested + "]}";
  CHECK_THROWS_WITH(make(tokenizer_json(nested)),
                    Contains("Sequence nested deeper than 32 levels"));
  // 100 steps side by side: encode recursed once per step.
  std::string many = R"({"type": "Sequence", "pretokenizers": [)";
  for (int i = 0; i < 100; ++i)
    many += R"({"type": "Split", "pattern": {"String": "x"}, "behavior": "Isolated"}, )";
  many += std::string(kGpt2Pre) + "]}";
  CHECK_THROWS_WITH(make(tokenizer_json(many)),
                    Contains("pre_tokenizer.pretokenizers[64]: more than 64 pre-tokenizer steps"));
}

TEST_CASE("hf tokenizer regex errors name the file and the regex field", "[data]") {
  // 2^n backtracking: PCRE2's match limit (error -47) on the trial text's run of 'a's, at load.
  CHECK_THROWS_WITH(make(tokenizer_json(split_then_byte_level("(\\p{L}|a)*\\d"))),
                    Contains("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: ") &&
                        Contains("PCRE2 error -47"));
  // The trial text has no long run of 'x': this one loads, and fails at encode, by name.
  const HfTokenizer tok = make(tokenizer_json(split_then_byte_level("(x|x)*(?=z)")));
  CHECK_THROWS_WITH(tok.encode(std::string(40, 'x')),
                    Contains("tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: ") &&
                        Contains("a piece of 40 bytes") && Contains("match limit"));
  // A capture repeated per character needed more than PCRE2's default 32 KiB JIT stack (-46).
  const HfTokenizer any = make(tokenizer_json(split_then_byte_level("(.)*")));
  const std::string long_line(60000, 'q');
  CHECK(any.decode(any.encode(long_line)) == long_line);
}
