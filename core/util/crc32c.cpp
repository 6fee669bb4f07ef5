// CRC-32C with a slicing-by-8 table (eight bytes a step); the reflected polynomial 0x82F63B78.
#include "core/util/crc32c.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace mod {

namespace {
using Table = std::array<std::array<uint32_t, 256>, 8>;

Table make_table() {
  Table t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  return t;
}
const Table kTable = make_table();
}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;
    crc = kTable[7][w & 0xFF] ^ kTable[6][(w >> 8) & 0xFF] ^ kTable[5][(w >> 16) & 0xFF] ^
          kTable[4][(w >> 24) & 0xFF] ^ kTable[3][(w >> 32) & 0xFF] ^
          kTable[2][(w >> 40) & 0xFF] ^ kTable[1][(w >> 48) & 0xFF] ^ kTable[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTable[0][(crc ^ *p++) & 0xFF];
  return ~crc;
}

std::string crc32c_text(uint32_t crc) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", crc);
  return b;
}

uint32_t parse_crc32c_text(const std::string& text, const std::string& where) {
  if (text.size() != 8 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::runtime_error(where + ": '" + text.substr(0, 20) +
                             "' is not a CRC-32C (8 lowercase hex digits)");
  return static_cast<uint32_t>(std::stoul(text, nullptr, 16));
}

}  // namespace mod
