// Datasets: manifests, shard sets and windows (see dataset.h).
#include "train/data/dataset.h"

#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "configs/config.h"
#include "core/util/atomic_file.h"

namespace mod::data {

namespace fs = std::filesystem;
namespace pb = modtrain::data;

namespace {
[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

std::string resolve(const std::string& dir, const std::string& path) {
  return fs::path(path).is_absolute() ? path : (fs::path(dir) / path).string();
}

void check_split(const std::string& path, const char* split,
                 const google::protobuf::RepeatedPtrField<pb::Shard>& shards) {
  if (shards.empty()) fail(path, std::string(split) + ": no shards (every dataset needs a " + split +
                                     " split)");
  for (int i = 0; i < shards.size(); ++i) {
    const std::string field = std::string(split) + "[" + std::to_string(i) + "]";
    if (shards[i].path().empty()) fail(path, field + ".path is empty");
    if (!pb::TokenFormat_IsValid(shards[i].format()))
      fail(path, field + ".format " + std::to_string(shards[i].format()) + " is not a format");
  }
}

ShardSet open_split(const std::string& dir, const std::string& manifest_path, const char* split,
                    const google::protobuf::RepeatedPtrField<pb::Shard>& shards, uint32_t vocab) {
  std::vector<TokenFile> files;
  for (int i = 0; i < shards.size(); ++i) {
    const pb::Shard& s = shards[i];
    TokenFile f = TokenFile::open(resolve(dir, s.path()), s.format(), vocab);
    if (f.tokens() != s.tokens())
      fail(manifest_path, std::string(split) + "[" + std::to_string(i) + "] (" + s.path() +
                              "): the manifest says " + std::to_string(s.tokens()) +
                              " tokens, the file holds " + std::to_string(f.tokens()));
    files.push_back(std::move(f));
  }
  return ShardSet(std::move(files), "dataset " + dir + " (" + split + " split)");
}

// A directory written by an older prep: tokenizer.txt, train.bin, val.bin (modtrain shards).
pb::Manifest legacy_manifest(const std::string& dir) {
  pb::Manifest m;
  m.set_version(1);
  for (auto [name, split] : {std::pair{"train.bin", m.add_train()}, {"val.bin", m.add_val()}}) {
    const TokenFile f = TokenFile::open(resolve(dir, name), pb::MODTRAIN, 0);
    split->set_path(name);
    split->set_tokens(f.tokens());
    if (m.vocab_size() == 0) m.set_vocab_size(f.vocab_size());
    if (f.vocab_size() != m.vocab_size())
      fail(dir, "train.bin and val.bin have different vocabularies (" +
                    std::to_string(m.vocab_size()) + ", " + std::to_string(f.vocab_size()) + ")");
  }
  if (fs::exists(resolve(dir, "tokenizer.txt"))) m.set_tokenizer("tokenizer.txt");
  return m;
}
}  // namespace

// --- ShardSet ---

ShardSet::ShardSet(std::vector<TokenFile> files, std::string origin)
    : files_(std::move(files)), origin_(std::move(origin)) {
  for (const TokenFile& f : files_) tokens_ += f.tokens();
}

uint64_t ShardSet::windows(int64_t seq_len) const {
  uint64_t n = 0;
  for (const TokenFile& f : files_)
    if (f.tokens() > 0) n += (f.tokens() - 1) / static_cast<uint64_t>(seq_len);
  return n;
}

void ShardSet::read_window(uint64_t w, int64_t seq_len, int64_t* in, int64_t* target) const {
  const uint64_t s = static_cast<uint64_t>(seq_len);
  for (const TokenFile& f : files_) {
    const uint64_t here = f.tokens() > 0 ? (f.tokens() - 1) / s : 0;
    if (w < here) {  // one read of the S + 1 tokens, so the window's pages are mapped once
      std::vector<int64_t> tokens(s + 1);
      f.read(w * s, s + 1, tokens.data());
      std::copy(tokens.begin(), tokens.end() - 1, in);
      std::copy(tokens.begin() + 1, tokens.end(), target);
      return;
    }
    w -= here;
  }
  throw std::out_of_range("shard set: window past the last of " + std::to_string(windows(seq_len)));
}

// --- manifests ---

pb::Manifest read_manifest(const std::string& path) {
  pb::Manifest m;
  config::parse_text_message(config::read_text_file(path, "dataset manifest"), path, m,
                             "dataset manifest:");
  if (m.version() != 1)
    fail(path, "version " + std::to_string(m.version()) + ", this build reads version 1");
  if (m.vocab_size() == 0) fail(path, "vocab_size is 0 or missing");
  if (m.has_eot_token() && m.eot_token() >= m.vocab_size())
    fail(path, "eot_token " + std::to_string(m.eot_token()) + " is outside the vocabulary of " +
                   std::to_string(m.vocab_size()));
  if (m.has_tokenizer_crc32c() && m.tokenizer().empty())
    fail(path, "tokenizer_crc32c is set but tokenizer names no file");
  check_split(path, "train", m.train());
  check_split(path, "val", m.val());
  return m;
}

void write_manifest(const std::string& path, const pb::Manifest& m) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(m, &text);
  util::replace_file(path, text);
}

pb::Manifest index_token_files(const std::vector<std::string>& train,
                               const std::vector<std::string>& val, TokenFormat format,
                               uint32_t vocab_size) {
  pb::Manifest m;
  m.set_version(1);
  m.set_vocab_size(vocab_size);
  for (auto [paths, split] : {std::pair{&train, m.mutable_train()}, {&val, m.mutable_val()}})
    for (const std::string& p : *paths) {
      const TokenFile f = TokenFile::open(p, format, vocab_size);
      pb::Shard* s = split->Add();
      s->set_path(fs::absolute(p).string());
      s->set_format(format);
      s->set_tokens(f.tokens());
      s->set_crc32c(f.full_crc());
    }
  return m;
}

// --- Dataset ---

Dataset Dataset::open(const std::string& dir) {
  Dataset d;
  d.dir = dir;
  const std::string manifest_path = resolve(dir, kManifestName);
  if (fs::exists(manifest_path)) {
    d.manifest = read_manifest(manifest_path);
  } else if (fs::exists(resolve(dir, "train.bin"))) {
    d.manifest = legacy_manifest(dir);
  } else {
    fail("data " + dir, std::string("no ") + kManifestName +
                            " (prepare it with `modtrain prep --out " + dir + " ...`)");
  }
  d.train = open_split(dir, manifest_path, "train", d.manifest.train(), d.manifest.vocab_size());
  d.val = open_split(dir, manifest_path, "val", d.manifest.val(), d.manifest.vocab_size());
  if (d.manifest.has_tokenizer_crc32c()) {
    const std::string tok = d.tokenizer_path();
    check_tokenizer_seal(tok, tokenizer_file_crc(tok), "dataset " + manifest_path,
                         d.manifest.tokenizer_crc32c());
  }
  return d;
}

std::string tokenizer_path(const std::string& dir) {
  const std::string manifest_path = resolve(dir, kManifestName);
  if (!fs::exists(manifest_path)) return resolve(dir, "tokenizer.txt");
  const pb::Manifest m = read_manifest(manifest_path);
  if (m.tokenizer().empty()) fail(manifest_path, "names no tokenizer (give one with --tokenizer)");
  return resolve(dir, m.tokenizer());
}

SealedTokenizer load_dataset_tokenizer(const std::string& dir) {
  SealedTokenizer t = load_sealed_tokenizer(tokenizer_path(dir));
  const std::string manifest_path = resolve(dir, kManifestName);
  if (fs::exists(manifest_path)) {
    const pb::Manifest m = read_manifest(manifest_path);
    if (m.has_tokenizer_crc32c())
      check_tokenizer_seal(t.path, t.crc32c, "dataset " + manifest_path, m.tokenizer_crc32c());
  }
  return t;
}

std::vector<ShardFingerprint> Dataset::train_fingerprint() const {
  std::vector<ShardFingerprint> out;
  for (int i = 0; i < manifest.train_size(); ++i) {
    const TokenFile& f = train.files().at(static_cast<size_t>(i));
    out.push_back({fs::path(f.path()).filename().string(), f.tokens(), manifest.train(i).crc32c(),
                   f.sample_crc()});
  }
  return out;
}

void check_same_shards(const std::vector<ShardFingerprint>& saved,
                       const std::vector<ShardFingerprint>& now, const std::string& where) {
  const auto hex = [](uint32_t v) {
    char b[16];
    std::snprintf(b, sizeof b, "%08x", v);
    return std::string(b);
  };
  if (saved.size() != now.size())
    fail(where, "trained on " + std::to_string(saved.size()) +
                    " training shards, the dataset now has " + std::to_string(now.size()));
  for (size_t i = 0; i < saved.size(); ++i) {
    const ShardFingerprint &a = saved[i], &b = now[i];
    const std::string at = "training shard " + std::to_string(i) + " ";
    if (a.name != b.name) fail(where, at + "was " + a.name + ", is now " + b.name);
    if (a.tokens != b.tokens)
      fail(where, at + a.name + " held " + std::to_string(a.tokens) + " tokens, now " +
                      std::to_string(b.tokens));
    if (a.crc32c != b.crc32c)
      fail(where, at + a.name + ": the manifest's CRC-32C was " + hex(a.crc32c) + ", is now " +
                      hex(b.crc32c) + " (the dataset was prepared again)");
    if (a.sample_crc != b.sample_crc)
      fail(where, at + a.name + " changed since the checkpoint (sampled CRC-32C " +
                      hex(a.sample_crc) + ", now " + hex(b.sample_crc) + ")");
  }
}

std::string Dataset::tokenizer_path() const {
  return manifest.tokenizer().empty() ? std::string() : resolve(dir, manifest.tokenizer());
}

}  // namespace mod::data
