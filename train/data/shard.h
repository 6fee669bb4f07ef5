// Token shards: a fixed 32-byte header then the tokens, little-endian.
//   magic "MODTOKS1" | version u32 | token width u32 (2 or 4 bytes) | vocab size u32 |
//   reserved u32 (0) | token count u64 | tokens...
// Readers check every header field and the file size, and name the file in every error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mod::data {

inline constexpr uint32_t kShardVersion = 1;

struct ShardHeader {
  uint32_t token_bytes = 2;
  uint32_t vocab_size = 0;
  uint64_t token_count = 0;
};

// Writes tokens (each < vocab_size) with the narrowest width that fits the vocabulary. The file
// is written to path + ".tmp" and renamed, so a reader never sees half a shard.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab_size);

// Reads and validates a whole shard.
std::vector<uint32_t> read_shard(const std::string& path, ShardHeader* header = nullptr);
ShardHeader read_shard_header(const std::string& path);

}  // namespace mod::data
