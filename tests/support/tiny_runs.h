// Shared by the parity and resume tests: a synthetic corpus on every rank and the tiny recipes
// with a small batch. The corpus is a random first-order Markov chain over 256 symbols (each
// with 4 likely successors), identical on every rank, so the loss falls within 20 steps.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "configs/config.h"
#include "core/random.h"
#include "parallel/world.h"
#include "train/data/token_file.h"
#include "train/trainer.h"

namespace mod::test {

// A private directory per rank and per call (CTest runs several MPI jobs at once), removed when
// the test program exits.
inline std::string temp_dir(const std::string& tag) {
  struct Cleanup {
    std::vector<std::string> dirs;
    ~Cleanup() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Cleanup cleanup;
  std::string pattern = (std::filesystem::temp_directory_path() /
                         ("modtrain_" + tag + "_r" + std::to_string(parallel::world().rank()) + "_XXXXXX"))
                            .string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  cleanup.dirs.push_back(pattern);
  return pattern;
}

inline std::string markov_corpus() {
  static std::string dir;
  if (!dir.empty()) return dir;
  dir = temp_dir("corpus");
  Rng rng(7);
  std::vector<uint32_t> next(256 * 4);
  for (auto& n : next) n = static_cast<uint32_t>(rng.below(256));
  auto chain = [&](size_t n) {
    std::vector<uint32_t> t(n);
    uint32_t s = 0;
    for (auto& x : t) {
      s = rng.below(8) == 0 ? static_cast<uint32_t>(rng.below(256)) : next[s * 4 + rng.below(4)];
      x = s;
    }
    return t;
  };
  data::write_shard(dir + "/train.bin", chain(200000), 256);
  data::write_shard(dir + "/val.bin", chain(20000), 256);
  return dir;
}

// configs/recipes/<name>.textproto for `steps` steps on the corpus, with a 4 x 128 batch
// (instead of 8 x 256) so that 4 oversubscribed ranks on 2 cores finish within a minute.
// layout: space-separated "dp=2 tp=2 pp=2 ep=2 zero_stage=2 sequence_parallel=true" (or the old
// zero1=true); extra: more field=value overrides.
inline modtrain::RunConfig tiny_recipe(const std::string& name, int steps, const std::string& layout,
                                       std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"train.steps=" + std::to_string(steps), "train.eval_every=0",
                                   "train.batch_size=4", "model.seq_len=128",
                                   "parallel.bucket_mb=0.25", "data.dir=" + markov_corpus()};
  for (const char* field : {"dp", "tp", "pp", "ep", "zero1", "zero_stage", "sequence_parallel"}) {
    const auto at = layout.find(std::string(field) + "=");
    if (at == std::string::npos) continue;
    sets.push_back("parallel." + layout.substr(at, layout.find(' ', at) - at));
  }
  sets.insert(sets.end(), extra.begin(), extra.end());
  // MOD_SOURCE_DIR in the environment wins: a test binary carried to another machine
  // (scripts/gpu_run.sh) finds the recipes in the checkout it runs from.
  const char* src = std::getenv("MOD_SOURCE_DIR");
  return config::load(std::string(src ? src : MOD_SOURCE_DIR) + "/configs/recipes/" + name + ".textproto",
                      sets);
}

inline double relative_norm_diff(const Tensor& a, const Tensor& b) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += (a.at(i) - b.at(i)) * (a.at(i) - b.at(i));
    norm += b.at(i) * b.at(i);
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace mod::test
