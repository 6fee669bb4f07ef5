// CRC-32C (Castagnoli), as used by TFRecord framing and checkpoint blob checksums.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mod {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);  // crc: running value to extend
// TFRecord's masked form: rotate right by 15 and add a constant.
inline uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace mod
