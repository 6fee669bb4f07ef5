// CRC-32C (Castagnoli), as used by TFRecord framing and checkpoint blob checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mod {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);  // crc: running value to extend
// TFRecord's masked form: rotate right by 15 and add a constant.
inline uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// A CRC-32C as metadata holds it (the weights seal, a tokenizer's seal): 8 lowercase hex digits.
std::string crc32c_text(uint32_t crc);
// Its inverse; an error naming `where` unless exactly 8 lowercase hex digits.
uint32_t parse_crc32c_text(const std::string& text, const std::string& where);

}  // namespace mod
