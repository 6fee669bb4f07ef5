// Datasets: manifests open their shards and check them; an older prep's directory opens as one
// shard per split; existing llm.c files are indexed without copying; bad headers and manifests
// name the file and field; a shard changed after a checkpoint is refused.
#include "train/data/dataset.h"
#include "tests/support/errors.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

using namespace mod::data;
using Catch::Contains;
namespace fs = std::filesystem;
namespace pb = modtrain::data;

using mod::test::error_of;
using mod::test::write_bytes;

namespace {
fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("modtrain_dataset_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint32_t> ramp(size_t n, uint32_t start) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = (start + static_cast<uint32_t>(i)) % 256;
  return t;
}


// A dataset of two training shards and one validation shard, with its manifest.
pb::Manifest two_shard_dataset(const fs::path& dir) {
  pb::Manifest m;
  m.set_version(1);
  m.set_vocab_size(256);
  m.set_tokenizer("tokenizer.txt");
  int i = 0;
  for (auto [name, n] : {std::pair{"train_000000.bin", 3000}, {"train_000001.bin", 1200}}) {
    write_shard((dir / name).string(), ramp(static_cast<size_t>(n), static_cast<uint32_t>(i++)), 256);
    pb::Shard* s = m.add_train();
    s->set_path(name);
    s->set_tokens(static_cast<uint64_t>(n));
    s->set_crc32c(TokenFile::open((dir / name).string(), pb::MODTRAIN, 256).full_crc());
  }
  write_shard((dir / "val_000000.bin").string(), ramp(500, 9), 256);
  pb::Shard* v = m.add_val();
  v->set_path("val_000000.bin");
  v->set_tokens(500);
  write_manifest((dir / kManifestName).string(), m);
  return m;
}
}  // namespace

TEST_CASE("a manifest opens its shards, and an older prep's directory opens too", "[data]") {
  const fs::path dir = temp_dir("open");
  two_shard_dataset(dir);
  const Dataset d = Dataset::open(dir.string());
  CHECK(d.vocab_size() == 256);
  CHECK(d.train.files().size() == 2);
  CHECK(d.train.tokens() == 4200);
  CHECK(d.val.tokens() == 500);
  CHECK(d.tokenizer_path() == (dir / "tokenizer.txt").string());
  CHECK(tokenizer_path(dir.string()) == (dir / "tokenizer.txt").string());

  const fs::path old = temp_dir("legacy");
  write_shard((old / "train.bin").string(), ramp(400, 0), 256);
  write_shard((old / "val.bin").string(), ramp(100, 0), 256);
  write_bytes(old / "tokenizer.txt", "modtrain-tokenizer 1\nkind byte\nvocab_size 256\n");
  const Dataset l = Dataset::open(old.string());
  CHECK(l.train.tokens() == 400);
  CHECK(l.val.tokens() == 100);
  CHECK(l.tokenizer_path() == (old / "tokenizer.txt").string());
  fs::remove_all(dir);
  fs::remove_all(old);
}

TEST_CASE("bad manifests and shards name the file and the field", "[data]") {
  const fs::path dir = temp_dir("bad");
  pb::Manifest m = two_shard_dataset(dir);
  const std::string manifest = (dir / kManifestName).string();

  CHECK_THROWS_WITH(Dataset::open((dir / "nothing").string()), Contains("dataset.textproto") && Contains("modtrain prep"));
  write_bytes(manifest, "version: 1\nvocab_size: 256\ntrain { path: \"train_000000.bin\" tokens: 3000 }\n");
  CHECK_THROWS_WITH(Dataset::open(dir.string()), Contains(manifest) && Contains("val: no shards"));
  write_bytes(manifest, "version: 2\n");
  CHECK_THROWS_WITH(Dataset::open(dir.string()), Contains("version 2"));
  write_bytes(manifest, "version: 1\nvocab_size: 256 bogus: 3\n");
  CHECK_THROWS_WITH(Dataset::open(dir.string()), Contains(manifest));

  pb::Manifest wrong = m;
  wrong.mutable_train(1)->set_tokens(1201);
  write_manifest(manifest, wrong);
  CHECK_THROWS_WITH(Dataset::open(dir.string()),
                    Contains("train[1]") && Contains("1201") && Contains("1200"));
  wrong = m;
  wrong.set_eot_token(256);
  write_manifest(manifest, wrong);
  CHECK_THROWS_WITH(Dataset::open(dir.string()), Contains("eot_token 256"));
  wrong = m;
  wrong.set_vocab_size(300);
  write_manifest(manifest, wrong);
  CHECK_THROWS_WITH(Dataset::open(dir.string()), Contains("train_000000.bin") && Contains("vocab size 256"));

  // Headers: llm.c magic, version, and a count the file cannot hold, all before any read.
  std::string llmc(1024 + 20, '\0');
  const int32_t magic = kLlmcMagic, version = 1, huge = 1 << 30;
  std::memcpy(llmc.data(), &magic, 4);
  std::memcpy(llmc.data() + 4, &version, 4);
  std::memcpy(llmc.data() + 8, &huge, 4);
  write_bytes(dir / "l.bin", llmc);
  CHECK_THROWS_WITH(TokenFile::open((dir / "l.bin").string(), pb::LLMC, 50257),
                    Contains("l.bin") && Contains("1073741824 tokens") && Contains("truncated"));
  const int32_t v2 = 2;
  std::memcpy(llmc.data() + 4, &v2, 4);
  write_bytes(dir / "l.bin", llmc);
  CHECK_THROWS_WITH(TokenFile::open((dir / "l.bin").string(), pb::LLMC, 50257), Contains("version 2"));
  std::memcpy(llmc.data(), &v2, 4);
  write_bytes(dir / "l.bin", llmc);
  CHECK_THROWS_WITH(TokenFile::open((dir / "l.bin").string(), pb::LLMC, 50257), Contains("magic 2"));
  write_bytes(dir / "odd.bin", "abc");
  CHECK_THROWS_WITH(TokenFile::open((dir / "odd.bin").string(), pb::NANOGPT, 50257),
                    Contains("odd.bin") && Contains("uint16"));
  CHECK_THROWS_WITH(TokenFile::open((dir / "odd.bin").string(), pb::NANOGPT, 0), Contains("vocabulary"));
  // A token past the vocabulary is found when it is read.
  write_bytes(dir / "nano.bin", std::string("\x01\x00\xff\xff", 4));
  const TokenFile nano = TokenFile::open((dir / "nano.bin").string(), pb::NANOGPT, 50257);
  int64_t out[2];
  CHECK_THROWS_WITH(nano.read(0, 2, out), Contains("nano.bin") && Contains("65535"));
  CHECK_THROWS_WITH(nano.read(1, 2, out), Contains("past"));
  fs::remove_all(dir);
}

TEST_CASE("llm.c shards are indexed where they lie, without copies", "[data]") {
  const fs::path dir = temp_dir("llmc");
  for (auto [name, n] : {std::pair{"fw_train_000001.bin", 700}, {"fw_val_000000.bin", 300}}) {
    std::string bytes(1024, '\0');
    const int32_t header[3] = {kLlmcMagic, 1, n};
    std::memcpy(bytes.data(), header, sizeof header);
    for (int i = 0; i < n; ++i) {
      const uint16_t t = static_cast<uint16_t>(50000 + i % 257);
      bytes.append(reinterpret_cast<const char*>(&t), 2);
    }
    write_bytes(dir / name, bytes);
  }
  const pb::Manifest m = index_token_files({(dir / "fw_train_000001.bin").string()},
                                           {(dir / "fw_val_000000.bin").string()}, pb::LLMC, 50257);
  const fs::path out = temp_dir("llmc_out");
  write_manifest((out / kManifestName).string(), m);
  const Dataset d = Dataset::open(out.string());
  CHECK(d.train.tokens() == 700);
  CHECK(d.val.tokens() == 300);
  CHECK(d.train.files()[0].width() == 2);
  int64_t t[2];
  d.train.files()[0].read(257, 2, t);  // tokens 50000 + i mod 257
  CHECK(t[0] == 50000);
  CHECK(t[1] == 50001);
  fs::remove_all(dir);
  fs::remove_all(out);
}

TEST_CASE("a shard changed after a checkpoint is refused, naming it", "[data]") {
  const fs::path dir = temp_dir("changed");
  pb::Manifest m = two_shard_dataset(dir);
  const auto saved = Dataset::open(dir.string()).train_fingerprint();
  CHECK_NOTHROW(check_same_shards(saved, Dataset::open(dir.string()).train_fingerprint(), "resume"));

  // One token rewritten in place: same size, same manifest.
  {
    std::fstream f(dir / "train_000001.bin", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(32 + 2 * 600);
    const uint16_t t = 77;
    f.write(reinterpret_cast<const char*>(&t), 2);
  }
  CHECK_THROWS_WITH(check_same_shards(saved, Dataset::open(dir.string()).train_fingerprint(), "resume"),
                    Contains("resume") && Contains("train_000001.bin") && Contains("changed"));
  // Prepared again: the manifest's CRC differs.
  auto now = saved;
  now[0].crc32c ^= 1;
  CHECK_THROWS_WITH(check_same_shards(saved, now, "resume"), Contains("prepared again"));
  now = saved;
  now.pop_back();
  CHECK_THROWS_WITH(check_same_shards(saved, now, "resume"), Contains("2 training shards") && Contains("now has 1"));
  now = saved;
  now[1].tokens = 5;
  CHECK_THROWS_WITH(check_same_shards(saved, now, "resume"), Contains("held 1200 tokens, now 5"));
  fs::remove_all(dir);
}
