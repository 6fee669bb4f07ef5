// UTF-8 decoding with Unicode's "maximal subpart" rule for invalid bytes (what Python's
// bytes.decode("utf-8", errors="replace") does), White_Space, and the GPT-2 byte-level alphabet
// (each byte a printable character), as tokenizer.json files need them (hf_tokenizer.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace mod::data {

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one; `sub` gets the length
// of the maximal subpart (lead byte plus continuation bytes that could still have been valid).
size_t utf8_sequence(std::string_view s, size_t i, size_t* sub);
// The code point at s[i] of valid UTF-8, and its length in bytes.
uint32_t decode_char(std::string_view s, size_t i, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
bool is_valid_utf8(std::string_view s);
// Every maximal subpart of an invalid sequence becomes one U+FFFD.
std::string replace_invalid_utf8(std::string_view s);
// Unicode White_Space (Rust's char::is_whitespace; Oniguruma's \s).
bool is_white_space(uint32_t c);

// GPT-2's byte-level map: byte -> printable character, and back.
struct ByteMap {
  std::array<uint32_t, 256> to_char{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap();
};
const ByteMap& byte_map();
// Mapped text -> bytes; nullopt when a character is outside the map.
std::optional<std::string> unmap_bytes(std::string_view mapped);

}  // namespace mod::data
