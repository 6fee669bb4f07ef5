// Corpus preparation (`modtrain prep`): text -> tokenizer.txt, train.bin, val.bin in one
// directory. Invariant: every k-th 64 KiB block of text (k = 1 / val_fraction) is held out for
// validation, so both splits span the corpus; a BPE tokenizer is trained on the training split
// only, so validation text never shapes the vocabulary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mod::data {

struct PrepOptions {
  std::string out;                  // output directory
  std::vector<std::string> inputs;  // text files, concatenated in order
  bool kjv = false;                 // the King James Bible (Debian's bible-kjv) before the inputs
  std::string tokenizer = "byte";   // byte or bpe
  uint32_t vocab_size = 4096;       // BPE vocabulary size (>= 256)
  double val_fraction = 0.05;       // held-out share, in (0, 0.5]
};

struct PrepResult {
  size_t text_bytes = 0;
  uint32_t vocab_size = 0;
  size_t train_tokens = 0, val_tokens = 0;
  double seconds = 0;  // tokenizer training, encoding and writing
};

// Throws std::invalid_argument (naming the option) on bad options or no text.
PrepResult prep(const PrepOptions& o);

}  // namespace mod::data
