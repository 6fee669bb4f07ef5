// Token files: modtrain shards (written here), llm.c shards and nanoGPT .bin files (read as they
// are). A TokenFile is a read-only memory map that keeps the stored width (uint16 stays uint16),
// so opening one costs no memory; every header field is checked against the file's size before
// anything is read, and every token is checked against the vocabulary when it is read.
//
// modtrain shard, little-endian: "MODTOKS1" | version u32 (1) | token width u32 (2 or 4) |
//   vocab size u32 | reserved u32 (0) | token count u64 | tokens.
// llm.c shard: 256 x int32 header (magic 20240520, version 1, token count) | uint16 tokens.
// nanoGPT: uint16 tokens, nothing else (the vocabulary comes from the manifest).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/dataset.pb.h"

namespace mod::data {

using TokenFormat = modtrain::data::TokenFormat;

inline constexpr uint32_t kShardVersion = 1;
inline constexpr uint64_t kShardHeaderBytes = 32;
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr uint64_t kLlmcHeaderBytes = 256 * 4;

const char* format_name(TokenFormat f);  // "modtrain", "llm.c", "nanoGPT"

class TokenFile {
 public:
  // Maps the file and checks its header. vocab_size: for nanoGPT files the vocabulary (required);
  // for the others, when non-zero, the vocabulary the file must declare (llm.c files declare
  // none: 0 means unchecked). Errors name the file and the field.
  static TokenFile open(const std::string& path, TokenFormat format, uint32_t vocab_size);

  const std::string& path() const { return path_; }
  TokenFormat format() const { return format_; }
  uint64_t tokens() const { return tokens_; }
  uint32_t width() const { return width_; }  // bytes per token: 2 or 4
  uint32_t vocab_size() const { return vocab_; }
  uint64_t file_bytes() const { return file_bytes_; }

  // Copies tokens [begin, begin + n) into out, checking each against the vocabulary. Every read
  // (and each CRC below) drops this process's mapping of the pages it touched once done (they
  // stay in the page cache), so resident memory does not grow with the share of the dataset
  // seen.
  void read(uint64_t begin, uint64_t n, int64_t* out) const;
  // CRC-32C of the file's header and of 16 blocks of 4 KiB spread evenly over it (the whole
  // file when it is at most 64 KiB): a fingerprint read in 64 KiB from a shard of any size,
  // which a rewritten shard almost surely changes (an edit between the blocks it misses).
  uint32_t sample_crc() const;
  // CRC-32C of the whole file (reads all of it).
  uint32_t full_crc() const;
 private:
  // Drops the mapping of the folios around bytes [offset, offset + bytes) of the file.
  void unmap(uint64_t offset, uint64_t bytes) const;

  struct Map;
  std::shared_ptr<const Map> map_;
  std::string path_;
  TokenFormat format_ = modtrain::data::MODTRAIN;
  uint64_t tokens_ = 0, file_bytes_ = 0, data_offset_ = 0;
  uint32_t width_ = 2, vocab_ = 0;
};

// Writes a modtrain shard by appending: path + ".partial" holds the header (count 0) and the
// tokens so far; finish() writes the count, fsyncs and renames it to path, so a reader never
// sees half a shard. Tokens use the narrowest width that fits the vocabulary.
class ShardWriter {
 public:
  // Starts path.partial afresh, or, when keep_tokens > 0, reopens an existing one and cuts it
  // back to its first keep_tokens tokens (resuming an interrupted prep).
  ShardWriter(std::string path, uint32_t vocab_size, uint64_t keep_tokens = 0);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void append(const uint32_t* tokens, size_t n);  // each < vocab_size, or an error
  uint64_t tokens() const { return tokens_; }
  void sync();      // fsync the partial file (a resume point)
  uint32_t finish();  // header, fsync, rename; returns the file's CRC-32C

 private:
  std::string path_;
  uint32_t vocab_, width_;
  uint64_t tokens_ = 0;
  int fd_ = -1;
};

// Writes a whole shard at once (tests, benchmarks).
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, uint32_t vocab_size);
// Reads a whole file of any format into memory (tests, small files only).
std::vector<uint32_t> read_all(const TokenFile& f);

}  // namespace mod::data
