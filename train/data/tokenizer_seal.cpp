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
  throw std::runtime_error("tokenizer " + path + " has CRC-32C " + seal_text(crc) + ", but " +
                           holder + " was made with one of CRC-32C " + seal_text(*sealed) +
                           " (a changed or different tokenizer file)");
}

std::string seal_text(uint32_t crc) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", crc);
  return b;
}

uint32_t parse_seal_text(const std::string& text, const std::string& where) {
  if (text.size() != 8 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error(where + ": '" + text.substr(0, 20) +
                             "' is not a CRC-32C (8 lowercase hex digits)");
  return static_cast<uint32_t>(std::stoul(text, nullptr, 16));
}

}  // namespace mod::data
