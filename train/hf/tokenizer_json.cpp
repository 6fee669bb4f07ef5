// modtrain tokenizers as tokenizer.json (see tokenizer_json.h).
#include "train/hf/tokenizer_json.h"

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "train/data/unicode.h"

namespace mod::hf {

// Classes as train/data/tokenizer.cpp's classify(): whitespace is C's isspace (\t \n \v \f \r and
// space); letters are ASCII letters and every byte >= 0x80, so every non-ASCII character.
const char* const kPretokenizeRegex =
    " ?(?:[A-Za-z]|[^\\x00-\\x7F])+"
    "| ?[0-9]+"
    "| ?[\\x00-\\x08\\x0E-\\x1F\\x21-\\x2F\\x3A-\\x40\\x5B-\\x60\\x7B-\\x7F]+"
    "|(?:[\\x09-\\x0D]| (?![^\\x09-\\x0D ]))+";

namespace {
using ojson = nlohmann::ordered_json;

std::string mapped(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) data::append_utf8(out, data::byte_map().to_char[b]);
  return out;
}

ojson byte_level() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
          {"use_regex", false}};
}
}  // namespace

std::string own_tokenizer_json(const data::Tokenizer& tok) {
  const std::string kind = tok.kind();
  std::vector<std::string> token_bytes;  // id -> bytes
  for (int b = 0; b < 256; ++b) token_bytes.emplace_back(1, static_cast<char>(b));
  ojson merges = ojson::array();
  ojson pre;
  if (kind == "byte") {
    pre = byte_level();
  } else if (kind == "bpe") {
    const auto& bpe = dynamic_cast<const data::BpeTokenizer&>(tok);
    std::unordered_map<std::string, size_t> first_id;
    for (size_t b = 0; b < 256; ++b) first_id.emplace(token_bytes[b], b);
    for (const auto& [l, r] : bpe.merges()) {
      const size_t id = token_bytes.size();
      token_bytes.push_back(token_bytes[l] + token_bytes[r]);
      const auto [it, fresh] = first_id.emplace(token_bytes.back(), id);
      if (!fresh)
        throw std::invalid_argument(
            "tokenizer: bpe tokens " + std::to_string(it->second) + " and " + std::to_string(id) +
            " have the same bytes; tokenizer.json keys its vocabulary by string and cannot hold "
            "both (export with --tokenizer FILE, or retrain the tokenizer)");
      merges.push_back({mapped(token_bytes[l]), mapped(token_bytes[r])});
    }
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", kPretokenizeRegex}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             byte_level()}}};
  } else {
    throw std::invalid_argument("tokenizer kind '" + kind +
                                "' has no tokenizer.json form (expected byte or bpe)");
  }
  ojson vocab = ojson::object();
  for (size_t id = 0; id < token_bytes.size(); ++id) vocab[mapped(token_bytes[id])] = id;
  const ojson j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", ojson::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor", nullptr},
      {"decoder", byte_level()},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump(1) + "\n";
}

}  // namespace mod::hf
