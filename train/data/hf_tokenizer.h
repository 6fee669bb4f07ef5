// HfTokenizer: a Hugging Face tokenizer.json of the byte-level BPE family (GPT-2, RoBERTa,
// Llama-3/tiktoken style). Invariant: encode(text) gives exactly the ids of the `tokenizers`
// library's `Tokenizer.from_file(f).encode(text, add_special_tokens=False).ids`, and every
// option this class cannot reproduce exactly is refused at load time, never approximated.
//
// Supported (anything else is a std::runtime_error naming the file and the JSON field path):
//   model          BPE: vocab, merges as "a b" strings or ["a", "b"] pairs, ignore_merges,
//                  dropout null, unk_token null, byte_fallback false, continuing_subword_prefix
//                  and end_of_word_suffix null or "".
//   normalizer     null, or a Sequence of no normalizers.
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex with the GPT-2 pattern), Split
//                  (Regex or String pattern, behavior Isolated or Removed, invert false), or a
//                  Sequence of these whose last step is the one ByteLevel.
//   decoder        ByteLevel or null.
//   post_processor ignored: we encode as add_special_tokens=False, so it never adds tokens.
//   truncation, padding: null.
//   added_tokens   split out of the text before pre-tokenization as the library's
//                  AddedVocabulary does: first the tokens with normalized=false, then those with
//                  normalized=true, each pass leftmost-longest; lstrip/rstrip absorb the
//                  Unicode whitespace next to the match. single_word=true is refused.
//
// Invalid UTF-8: before anything else, each maximal invalid subpart of the input is replaced
// by U+FFFD, exactly as Python's bytes.decode("utf-8", errors="replace") does. So encode(raw)
// equals the library's encode(raw.decode("utf-8", "replace")), and decode(encode(raw)) == raw
// only for valid UTF-8.
//
// Regexes run on PCRE2 (UTF | UCP, JIT when available); `\s`/`\S` are rewritten to the Unicode
// White_Space set the library's Oniguruma uses (PCRE2's \s also takes U+180E). Each is tried on a
// sample text at load, under PCRE2's match limit and a 4 MiB JIT stack; a failure there or at
// encode is an error naming the file and the regex field.
//
// decode(ids) returns bytes: model tokens through the inverse byte-level map, added tokens as
// their content (skip_special_tokens=False). Unlike the library it does not replace bytes that
// are not valid UTF-8 with U+FFFD, so any token sequence decodes losslessly. decode(encode(s))
// == s for valid UTF-8 s, except that ByteLevel add_prefix_space=true keeps the spaces it added
// (one before each stretch of text that does not start with a space), as the library does.
//
// encode() is safe to call from several threads on one instance: the word cache is
// thread-local (one per thread and instance, bounded).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "train/data/tokenizer.h"

namespace mod::data {

class HfTokenizer final : public Tokenizer {
 public:
  // Parses tokenizer.json text; `name` (usually the path) prefixes every error.
  HfTokenizer(std::string json_text, const std::string& name);
  ~HfTokenizer() override;
  static std::unique_ptr<HfTokenizer> from_file(const std::string& path);

  std::string kind() const override { return "hf"; }
  uint32_t vocab_size() const override { return vocab_size_; }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<uint32_t>& tokens) const override;
  void save(const std::string& path) const override;  // the original JSON text, unchanged
  std::optional<uint32_t> special_token(std::string_view content) const override;

  struct Impl;

 private:
  std::string json_text_;
  uint32_t vocab_size_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mod::data
