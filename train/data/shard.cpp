// Token shard reader and writer (format in shard.h).
#include "train/data/shard.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace mod::data {

namespace {
constexpr char kMagic[8] = {'M', 'O', 'D', 'T', 'O', 'K', 'S', '1'};
constexpr size_t kHeaderBytes = 32;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("token shard " + path + ": " + what);
}

template <typename T>
void put(std::vector<char>& buf, size_t at, T v) {
  std::memcpy(buf.data() + at, &v, sizeof(T));
}
template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

ShardHeader parse_header(const std::string& path, const char* h, uint64_t file_bytes) {
  if (std::memcmp(h, kMagic, 8) != 0) fail(path, "bad magic: not a modtrain token shard");
  const uint32_t version = get<uint32_t>(h + 8);
  if (version != kShardVersion)
    fail(path, "version " + std::to_string(version) + ", this build reads version " +
                   std::to_string(kShardVersion));
  ShardHeader hdr;
  hdr.token_bytes = get<uint32_t>(h + 12);
  hdr.vocab_size = get<uint32_t>(h + 16);
  hdr.token_count = get<uint64_t>(h + 24);
  if (hdr.token_bytes != 2 && hdr.token_bytes != 4)
    fail(path, "token width " + std::to_string(hdr.token_bytes) + " bytes, expected 2 or 4");
  if (hdr.vocab_size == 0 || (hdr.token_bytes == 2 && hdr.vocab_size > 65536))
    fail(path, "vocab size " + std::to_string(hdr.vocab_size) + " does not fit " +
                   std::to_string(hdr.token_bytes) + "-byte tokens");
  const uint64_t expected = kHeaderBytes + hdr.token_count * hdr.token_bytes;
  if (file_bytes != expected)
    fail(path, "file is " + std::to_string(file_bytes) + " bytes but the header promises " +
                   std::to_string(hdr.token_count) + " tokens (" + std::to_string(expected) +
                   " bytes): truncated or corrupt");
  return hdr;
}
}  // namespace

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab_size) {
  const uint32_t width = vocab_size <= 65536 ? 2 : 4;
  std::vector<char> buf(kHeaderBytes + tokens.size() * width, 0);
  std::memcpy(buf.data(), kMagic, 8);
  put<uint32_t>(buf, 8, kShardVersion);
  put<uint32_t>(buf, 12, width);
  put<uint32_t>(buf, 16, vocab_size);
  put<uint64_t>(buf, 24, tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size)
      fail(path, "token " + std::to_string(i) + " = " + std::to_string(tokens[i]) +
                     " is outside the vocabulary of " + std::to_string(vocab_size));
    if (width == 2)
      put<uint16_t>(buf, kHeaderBytes + 2 * i, static_cast<uint16_t>(tokens[i]));
    else
      put<uint32_t>(buf, kHeaderBytes + 4 * i, tokens[i]);
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(path, "cannot open " + tmp + " for writing");
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    out.flush();
    if (!out) fail(path, "write failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(path, "cannot rename " + tmp + ": " + ec.message());
}

ShardHeader read_shard_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open (does it exist? run `modtrain prep` first)");
  char h[kHeaderBytes];
  in.read(h, kHeaderBytes);
  if (in.gcount() != static_cast<std::streamsize>(kHeaderBytes))
    fail(path, "shorter than the 32-byte header");
  return parse_header(path, h, std::filesystem::file_size(path));
}

std::vector<uint32_t> read_shard(const std::string& path, ShardHeader* header_out) {
  const ShardHeader hdr = read_shard_header(path);
  std::ifstream in(path, std::ios::binary);
  in.seekg(kHeaderBytes);
  std::vector<char> raw(hdr.token_count * hdr.token_bytes);
  in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!in) fail(path, "read failed");
  std::vector<uint32_t> tokens(hdr.token_count);
  for (uint64_t i = 0; i < hdr.token_count; ++i) {
    tokens[i] = hdr.token_bytes == 2 ? get<uint16_t>(raw.data() + 2 * i)
                                     : get<uint32_t>(raw.data() + 4 * i);
    if (tokens[i] >= hdr.vocab_size)
      fail(path, "token " + std::to_string(i) + " = " + std::to_string(tokens[i]) +
                     " is outside the vocabulary of " + std::to_string(hdr.vocab_size));
  }
  if (header_out) *header_out = hdr;
  return tokens;
}

}  // namespace mod::data
