// modtrain's own tokenizers written as a Hugging Face tokenizer.json that the `tokenizers`
// library (and modtrain's HfTokenizer) loads and encodes to the same ids, for `modtrain export
// --format hf` (docs/hf.md). Invariant: for valid UTF-8 text, Tokenizer.from_str(json).encode(
// text, add_special_tokens=False).ids equals the modtrain tokenizer's encode(text).
//   byte: a BPE of the 256 byte-level characters with no merges, ByteLevel pre-tokenizer only.
//   bpe:  the same vocabulary plus one token per merge, and the merges in order, behind a Split
//         whose regex is pretokenize()'s rule (train/data/tokenizer.h), then ByteLevel.
#pragma once

#include <string>

#include "train/data/tokenizer.h"

namespace mod::hf {

// pretokenize()'s rule as one regex (Oniguruma and PCRE2 syntax): " ?letters" (ASCII letters and
// every non-ASCII character), " ?digits", " ?other ASCII", and runs of C-locale whitespace that
// leave a final ' ' to a following non-space.
extern const char* const kPretokenizeRegex;

// The tokenizer.json text for a byte or bpe tokenizer. A bpe whose merges give two tokens the
// same bytes (which tokenizer.json's vocabulary, keyed by string, cannot hold) is an error naming
// both ids; any other kind is an error naming it.
std::string own_tokenizer_json(const data::Tokenizer& tok);

}  // namespace mod::hf
