// A dataset: a directory with a manifest (dataset.textproto, train/data/dataset.proto), its
// tokenizer and its token shards, split into a training and a validation shard set. Nothing is
// read at open but headers and fingerprints, so a rank's memory does not depend on the
// dataset's size. A directory from an older prep (tokenizer.txt, train.bin, val.bin and no
// manifest) opens as a dataset of one shard per split.
//
// Windows: every shard is cut into consecutive windows of S + 1 tokens that overlap by one
// (inputs t .. t+S-1, targets t+1 .. t+S); windows never cross shards, and window w of a set
// counts through the shards in manifest order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/data/dataset.pb.h"
#include "train/data/token_file.h"
#include "train/data/tokenizer_seal.h"

namespace mod::data {

inline constexpr const char* kManifestName = "dataset.textproto";

class ShardSet {
 public:
  ShardSet() = default;
  // origin names the set in errors, e.g. "dataset data/kjv (train split)".
  explicit ShardSet(std::vector<TokenFile> files, std::string origin = "shard set");

  const std::vector<TokenFile>& files() const { return files_; }
  const std::string& origin() const { return origin_; }
  uint64_t tokens() const { return tokens_; }
  uint64_t windows(int64_t seq_len) const;
  // Window w: inputs to in[0, S), targets to target[0, S).
  void read_window(uint64_t w, int64_t seq_len, int64_t* in, int64_t* target) const;

 private:
  std::vector<TokenFile> files_;
  uint64_t tokens_ = 0;
  std::string origin_ = "shard set";
};

// What identifies a shard for resume: a checkpoint stores its training shards' fingerprints and
// refuses to continue on others. A rewritten shard changes its token count, the manifest's CRC
// (prep records it) or the sampled CRC (TokenFile::sample_crc).
struct ShardFingerprint {
  std::string name;  // file name, without the directory (a dataset may move)
  uint64_t tokens = 0;
  uint32_t crc32c = 0;      // the manifest's
  uint32_t sample_crc = 0;  // read from the file
};
// Throws "<where>: <what changed>" at the first difference.
void check_same_shards(const std::vector<ShardFingerprint>& saved,
                       const std::vector<ShardFingerprint>& now, const std::string& where);

struct Dataset {
  std::string dir;
  modtrain::data::Manifest manifest;
  ShardSet train, val;

  // Opens dir's manifest (or an older prep's train.bin/val.bin), maps every shard and checks
  // its header, token count and format against the manifest, and the tokenizer file against
  // the manifest's seal when it has one. Errors name the file and field.
  static Dataset open(const std::string& dir);
  uint32_t vocab_size() const { return manifest.vocab_size(); }
  // The tokenizer file (absolute or relative to the working directory); empty when none.
  std::string tokenizer_path() const;
  // The training shards' fingerprints (reads a few blocks of every shard).
  std::vector<ShardFingerprint> train_fingerprint() const;
};

// The tokenizer file of the dataset in dir (read from its manifest only; an older prep's
// tokenizer.txt when there is none); an error when the dataset names no tokenizer.
std::string tokenizer_path(const std::string& dir);
// That tokenizer, loaded and checked against the manifest's seal when it has one.
SealedTokenizer load_dataset_tokenizer(const std::string& dir);

// Reads and checks a manifest (fields named in errors).
modtrain::data::Manifest read_manifest(const std::string& path);
// Writes path atomically (path.tmp, fsync, rename).
void write_manifest(const std::string& path, const modtrain::data::Manifest& m);

// A manifest over existing llm.c or nanoGPT token files (not copied or converted): shard paths
// as given, token counts from their headers or sizes, CRC-32C of each file.
modtrain::data::Manifest index_token_files(const std::vector<std::string>& train,
                                           const std::vector<std::string>& val,
                                           TokenFormat format, uint32_t vocab_size);

}  // namespace mod::data
