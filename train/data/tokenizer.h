// Tokenizers: byte-level (vocabulary 256) and byte-level BPE trained on the corpus. Both map
// any byte string to tokens and back losslessly. Saved as a small text file beside the shards:
//   modtrain-tokenizer 1 / kind byte|bpe / vocab_size N / merges M / then M lines "left right".
// A Hugging Face tokenizer.json loads as HfTokenizer (train/data/hf_tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mod::data {

// Tokenizer files are read whole, so only a regular file of at most this size is read: a device
// such as /dev/zero would be read until memory ran out. Real files are a few MB (Gemma's 33 MB).
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{64} << 20;
// A BPE token's bytes, and all tokens' bytes together: a merge may double a token, so 40 merges
// of a file could ask for 2^40 bytes; a trained BPE's longest tokens have tens of bytes.
inline constexpr uint64_t kMaxTokenBytes = 4096;
inline constexpr uint64_t kMaxVocabBytes = uint64_t{64} << 20;

// The bytes of a tokenizer file: a regular file of at most kMaxTokenizerFileBytes, else an
// error naming the file and the bound.
std::string read_tokenizer_file(const std::string& path);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;
  virtual uint32_t vocab_size() const = 0;
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<uint32_t>& tokens) const = 0;
  virtual void save(const std::string& path) const = 0;
  // The id of an added/special token given its text (e.g. "<|endoftext|>"), if there is one.
  virtual std::optional<uint32_t> special_token(std::string_view content) const {
    (void)content;
    return std::nullopt;
  }

  // Reads a tokenizer file (read_tokenizer_file), checking every line; errors name the file and
  // the line. A JSON file (name ending in .json, or first non-space byte '{') loads as an
  // HfTokenizer.
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // The same from the file's bytes (path names it in errors and picks the kind).
  static std::unique_ptr<Tokenizer> parse(std::string bytes, const std::string& path);
  // The modtrain text format from memory (path names it in errors): every line is exactly its
  // expected tokens ("kind bpe", "left right"), numbers are plain decimals, nothing follows.
  static std::unique_ptr<Tokenizer> parse_text(const std::string& text, const std::string& path);
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "byte"; }
  uint32_t vocab_size() const override { return 256; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint32_t>& tokens) const override;
  void save(const std::string& path) const override;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Learns vocab_size - 256 merges from text. Merges never cross pre-token boundaries (a word
  // with its leading space, a run of digits, of punctuation, or of whitespace), nor make a
  // token longer than kMaxTokenBytes.
  static BpeTokenizer train(std::string_view text, uint32_t vocab_size);
  // Throws std::invalid_argument on a merge of later tokens or beyond kMaxTokenBytes or
  // kMaxVocabBytes.
  explicit BpeTokenizer(std::vector<std::pair<uint32_t, uint32_t>> merges);

  std::string kind() const override { return "bpe"; }
  uint32_t vocab_size() const override { return 256 + static_cast<uint32_t>(merges_.size()); }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint32_t>& tokens) const override;
  void save(const std::string& path) const override;
  const std::vector<std::pair<uint32_t, uint32_t>>& merges() const { return merges_; }

 private:
  std::vector<uint32_t> encode_word(std::string_view word) const;

  std::vector<std::pair<uint32_t, uint32_t>> merges_;  // merge i creates token 256 + i
  std::unordered_map<uint64_t, uint32_t> rank_;         // (left << 32 | right) -> merge index
  std::vector<std::string> bytes_;                      // token -> its bytes
};

// Splits text into pre-tokens (see BpeTokenizer::train); concatenated they give text back.
std::vector<std::string_view> pretokenize(std::string_view text);

}  // namespace mod::data
