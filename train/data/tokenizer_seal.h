// A tokenizer's seal: the CRC-32C of its file's bytes. prep records it in the dataset manifest
// (tokenizer_crc32c); training copies the manifest's into the weights' metadata and every
// checkpoint; each load of a tokenizer beside one of them compares, so a changed tokenizer file
// is an error naming both files and both CRCs. Records older than the seal carry none and are
// not checked.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "train/data/tokenizer.h"

namespace mod::data {

struct SealedTokenizer {
  std::unique_ptr<Tokenizer> tokenizer;
  std::string path;
  uint32_t crc32c = 0;  // of the bytes the tokenizer was parsed from
};

// Reads the file once (read_tokenizer_file) and parses the bytes it sealed.
SealedTokenizer load_sealed_tokenizer(const std::string& path);
// The seal of a tokenizer file without parsing it.
uint32_t tokenizer_file_crc(const std::string& path);

// Throws "tokenizer <path> has CRC-32C <crc>, but <holder> was made with one of CRC-32C
// <sealed>" unless they agree; no check when sealed is absent.
void check_tokenizer_seal(const std::string& path, uint32_t crc, const std::string& holder,
                          std::optional<uint32_t> sealed);

// The seal as a weights file's metadata holds it: crc32c_text (core/util/crc32c.h).

}  // namespace mod::data
