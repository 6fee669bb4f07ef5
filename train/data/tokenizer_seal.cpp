// Tokenizer seals (see tokenizer_seal.h).
#include "train/data/tokenizer_seal.h"

#include <cstdio>
#include <stdexcept>

#include "core/util/crc32c.h"

namespace mod::data {

SealedTokenizer load_sealed_tokenizer(const std::string& path) {
  std::string bytes = read_tokenizer_file(path);
  SealedTokenizer t;
  t.path = path;
  t.crc32c = crc32c(bytes.data(), bytes.size());
  t.tokenizer = Tokenizer::parse(std::move(bytes), path);
  return t;
}

uint32_t tokenizer_file_crc(const std::string& path) {
  const std::string bytes = read_tokenizer_file(path);
  return crc32c(bytes.data(), bytes.size());
}

void check_tokenizer_seal(const std::string& path, uint32_t crc, const std::string& holder,
                          std::optional<uint32_t> sealed) {
  if (!sealed || *sealed == crc) return;
  throw std::runtime_error("tokenizer " + path + " has CRC-32C " + crc32c_text(crc) + ", but " +
                           holder + " was made with one of CRC-32C " + crc32c_text(*sealed) +
                           " (a changed or different tokenizer file)");
}

}  // namespace mod::data
