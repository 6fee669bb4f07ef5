// The window loader over shard sets: windows of files of every format and width equal a
// reference cut in the test; each epoch visits every window once; a DP rank's rows equal the
// same rows of the whole batch; a restored state continues bit-exactly, also under dp = 2.
#include "train/data/loader.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "train/data/permutation.h"

using namespace mod;
using namespace mod::data;
namespace fs = std::filesystem;
namespace pb = modtrain::data;

namespace {
fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("modtrain_loader_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Tokens start, start + 1, ... modulo vocab: every window of every file is recognisable.
std::vector<uint32_t> ramp(size_t n, uint32_t start, uint32_t vocab) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>((start + i) % vocab);
  return t;
}

void write_llmc(const fs::path& p, const std::vector<uint32_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = kLlmcMagic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (uint32_t t : tokens) {
    const uint16_t v = static_cast<uint16_t>(t);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
}

void write_nanogpt(const fs::path& p, const std::vector<uint32_t>& tokens) {
  std::ofstream f(p, std::ios::binary);
  for (uint32_t t : tokens) {
    const uint16_t v = static_cast<uint16_t>(t);
    f.write(reinterpret_cast<const char*>(&v), 2);
  }
}

// Four files: modtrain uint16 and uint32 shards, an llm.c shard and a nanoGPT file, of
// different lengths, with the tokens each holds.
struct Files {
  ShardSet set;
  std::vector<std::vector<uint32_t>> tokens;
};
Files four_files(const fs::path& dir) {
  constexpr uint32_t kVocab = 60000;  // fits uint16; the uint32 shard declares a larger one
  Files f;
  f.tokens = {ramp(1001, 0, kVocab), ramp(517, 100, kVocab), ramp(2048, 7, kVocab), ramp(333, 50, kVocab)};
  write_shard((dir / "a.bin").string(), f.tokens[0], kVocab);
  write_shard((dir / "wide.bin").string(), f.tokens[1], 70000);
  write_llmc(dir / "llmc.bin", f.tokens[2]);
  write_nanogpt(dir / "nano.bin", f.tokens[3]);
  std::vector<TokenFile> files;
  files.push_back(TokenFile::open((dir / "a.bin").string(), pb::MODTRAIN, kVocab));
  files.push_back(TokenFile::open((dir / "wide.bin").string(), pb::MODTRAIN, 70000));
  files.push_back(TokenFile::open((dir / "llmc.bin").string(), pb::LLMC, kVocab));
  files.push_back(TokenFile::open((dir / "nano.bin").string(), pb::NANOGPT, kVocab));
  f.set = ShardSet(std::move(files));
  return f;
}

std::vector<int64_t> rows_of(const Batch& b) {
  const auto v = b.inputs.to_vector();
  return std::vector<int64_t>(v.begin(), v.end());
}
}  // namespace

TEST_CASE("a permutation is a bijection of 0 .. n-1 that depends on its key", "[data]") {
  for (uint64_t n : {1ull, 2ull, 3ull, 17ull, 1000ull, 4097ull}) {
    const Permutation p(n, 42), q(n, 43);
    std::set<uint64_t> seen;
    bool differs = false;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t y = p(i);
      CHECK(y < n);
      seen.insert(y);
      differs = differs || y != q(i);
    }
    CHECK(seen.size() == n);
    if (n > 3) CHECK(differs);
  }
  CHECK_THROWS(Permutation(10, 1)(10));
}

TEST_CASE("windows over shards of every format and width equal a reference", "[data]") {
  const fs::path dir = temp_dir("formats");
  const Files f = four_files(dir);
  constexpr int64_t S = 16;
  CHECK(f.set.files()[0].width() == 2);
  CHECK(f.set.files()[1].width() == 4);
  // Reference: each file cut into windows of S + 1 tokens overlapping by one, files in order.
  std::vector<std::vector<int64_t>> ref;
  for (const auto& t : f.tokens)
    for (size_t start = 0; start + S + 1 <= t.size(); start += S)
      ref.emplace_back(t.begin() + static_cast<long>(start), t.begin() + static_cast<long>(start + S + 1));
  REQUIRE(f.set.windows(S) == ref.size());
  CHECK(ref.size() == 1000 / 16 + 516 / 16 + 2047 / 16 + 332 / 16);
  std::vector<int64_t> in(S), tg(S);
  for (size_t w = 0; w < ref.size(); ++w) {
    f.set.read_window(w, S, in.data(), tg.data());
    CHECK(std::equal(in.begin(), in.end(), ref[w].begin()));
    CHECK(std::equal(tg.begin(), tg.end(), ref[w].begin() + 1));
  }
  CHECK_THROWS(f.set.read_window(ref.size(), S, in.data(), tg.data()));
  fs::remove_all(dir);
}

TEST_CASE("each epoch visits every window once, in an order of its own", "[data]") {
  const fs::path dir = temp_dir("epoch");
  const Files f = four_files(dir);
  constexpr int64_t S = 16, B = 5;
  WindowLoader loader(f.set, S, B, 7);
  const uint64_t W = f.set.windows(S);
  REQUIRE(loader.batches_per_epoch() == static_cast<int64_t>(W / B));
  std::vector<std::vector<uint64_t>> epochs(2);
  for (int e = 0; e < 2; ++e)
    for (int64_t n = 0; n < loader.batches_per_epoch(); ++n) {
      CHECK(loader.epoch() == e);
      const int64_t batch = loader.state().batches_drawn;
      const Batch b = loader.next();
      std::vector<int64_t> in(S), tg(S);
      for (int64_t r = 0; r < B; ++r) {
        const uint64_t w = loader.window(batch, r);
        epochs[e].push_back(w);
        f.set.read_window(w, S, in.data(), tg.data());
        const auto got = b.inputs.to_vector();
        CHECK(std::equal(in.begin(), in.end(), got.begin() + r * S));
      }
    }
  for (const auto& e : epochs) {
    CHECK(e.size() == W / B * B);
    CHECK(std::set<uint64_t>(e.begin(), e.end()).size() == e.size());  // no repeats
  }
  CHECK(epochs[0] != epochs[1]);
  WindowLoader other_seed(f.set, S, B, 8);
  CHECK(rows_of(other_seed.next()) != rows_of(WindowLoader(f.set, S, B, 7).next()));
  // Fewer windows than one batch: an error that gives the counts.
  CHECK_THROWS_WITH(WindowLoader(f.set, 1000, 5, 1), Catch::Contains("fewer than one global batch"));
  fs::remove_all(dir);
}

TEST_CASE("a DP rank's slice equals the same rows of the whole batch", "[data]") {
  const fs::path dir = temp_dir("dp");
  const Files f = four_files(dir);
  WindowLoader whole(f.set, 8, 6, 3), rank0(f.set, 8, 6, 3), rank1(f.set, 8, 6, 3);
  for (int step = 0; step < 3; ++step) {
    auto all = rows_of(whole.next());
    auto lo = rows_of(rank0.next(0, 3));
    auto hi = rows_of(rank1.next(3, 6));
    lo.insert(lo.end(), hi.begin(), hi.end());
    CHECK(lo == all);
  }
  fs::remove_all(dir);
}

TEST_CASE("restoring a saved state continues bit-exactly, also under dp = 2", "[data]") {
  const fs::path dir = temp_dir("resume");
  const Files f = four_files(dir);
  constexpr int64_t S = 8, B = 4;
  WindowLoader run(f.set, S, B, 11);
  // Stop mid-way through the second epoch.
  const int64_t stop = run.batches_per_epoch() + 3;
  for (int64_t n = 0; n < stop; ++n) run.next();
  const LoaderState saved = run.state();
  CHECK(saved.batches_drawn == stop);
  std::vector<std::vector<int64_t>> expected;
  for (int n = 0; n < 5; ++n) expected.push_back(rows_of(run.next()));
  WindowLoader resumed(f.set, S, B, 11), rank0(f.set, S, B, 11), rank1(f.set, S, B, 11);
  resumed.restore(saved);
  rank0.restore(saved);
  rank1.restore(saved);
  for (int n = 0; n < 5; ++n) {
    CHECK(rows_of(resumed.next()) == expected[n]);
    auto lo = rows_of(rank0.next(0, 2));
    const auto hi = rows_of(rank1.next(2, 4));
    lo.insert(lo.end(), hi.begin(), hi.end());
    CHECK(lo == expected[n]);
  }
  fs::remove_all(dir);
}

// next() reads the following batch ahead; what it hands out must not depend on that.
TEST_CASE("a prefetched batch is used only for the very state and rows it was read for", "[data]") {
  const fs::path dir = temp_dir("prefetch");
  const Files f = four_files(dir);
  constexpr int64_t S = 8, B = 4;
  WindowLoader ref(f.set, S, B, 5);
  std::vector<std::vector<int64_t>> batch;  // the whole batches 0..7, read by a fresh loader each
  for (int64_t n = 0; n < 8; ++n) {
    WindowLoader fresh(f.set, S, B, 5);
    fresh.restore({5, n});
    batch.push_back(rows_of(fresh.next()));
  }
  auto rows = [&](int64_t n, int64_t lo, int64_t hi) {  // rows [lo, hi) of batch n
    return std::vector<int64_t>(batch[n].begin() + lo * S, batch[n].begin() + hi * S);
  };
  WindowLoader l(f.set, S, B, 5);
  for (int64_t n = 0; n < 3; ++n) CHECK(rows_of(l.next()) == batch[n]);
  CHECK(l.prefetched() == 2);  // every batch after the first came from the read ahead
  CHECK(rows_of(l.next(0, 2)) == rows(3, 0, 2));  // other rows than were read ahead
  CHECK(rows_of(l.next(0, 2)) == rows(4, 0, 2));
  CHECK(l.prefetched() == 3);
  l.restore({5, 1});  // back, with batch 5 read ahead
  CHECK(rows_of(l.next()) == batch[1]);
  CHECK(rows_of(l.next()) == batch[2]);
  l.restore({6, 3});  // another seed, same position
  WindowLoader other(f.set, S, B, 6);
  other.restore({6, 3});
  CHECK(rows_of(l.next()) == rows_of(other.next()));
  CHECK(l.prefetched() == 4);
  CHECK(l.state().batches_drawn == 4);  // the batch read ahead is not in the state
  fs::remove_all(dir);
}

TEST_CASE("sequential validation batches tile the shards in order", "[data]") {
  const fs::path dir = temp_dir("val");
  std::vector<uint32_t> tokens(100);
  std::iota(tokens.begin(), tokens.end(), 0u);
  write_shard((dir / "v0.bin").string(), tokens, 256);
  write_shard((dir / "v1.bin").string(), ramp(25, 200, 256), 256);
  std::vector<TokenFile> files;
  files.push_back(TokenFile::open((dir / "v0.bin").string(), pb::MODTRAIN, 256));
  files.push_back(TokenFile::open((dir / "v1.bin").string(), pb::MODTRAIN, 256));
  const ShardSet set(std::move(files));
  const auto batches = sequential_batches(set, 10, 3, 100);
  REQUIRE(batches.size() == 3);  // 9 windows of 10 (+1 target) in 100 tokens, 2 in 25: 11 -> 3 x 3
  CHECK(batches[1].inputs.at(0) == 30);
  CHECK(batches[2].targets.at(3 * 10 - 1) == 90);
  CHECK(batches[2].inputs.at(0) == 60);
  CHECK(sequential_batches(set, 10, 11, 100).size() == 1);
  CHECK(sequential_batches(set, 10, 11, 100)[0].inputs.at(10 * 10) == 210);  // second file's 2nd window
  fs::remove_all(dir);
}
