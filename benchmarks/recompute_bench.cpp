// recompute_bench: what train.recompute costs and saves on one config. For each mode (NONE,
// SELECTIVE, FULL) it first checks that one step's loss and every gradient equal NONE's bit for
// bit (a hash of their bytes), then times forward + backward steps and reports the memory the
// forward leaves held for backward: resident bytes after the forward minus before it.
//
// The resident delta is live memory only when freed blocks go back to the system: run with
// MOD_HOST_CACHE_MB=0 MALLOC_MMAP_THRESHOLD_=65536 (no host cache, large blocks mmap'd), e.g.
//   MOD_HOST_CACHE_MB=0 MALLOC_MMAP_THRESHOLD_=65536 recompute_bench
//       --config configs/recipes/tiny_mod.textproto --steps 3
// The napkin line gives what each block keeps per token by what the ops save (see
// docs/recompute.md), in floats, for a dense GELU block without autocast.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_common.h"
#include "configs/config.h"
#include "core/all_ops.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/transformer.h"

using namespace mod;
using bench::Clock;
using bench::seconds_since;
using model::Recompute;
using modtrain::TrainConfig;

namespace {

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// FNV-1a over the bytes of the loss and of every gradient, in parameter order.
uint64_t hash_bytes(uint64_t h, const Tensor& t) {
  const Tensor c = t.to(Device::CPU);
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

Tensor tokens_for(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> ids(b * t);
  for (auto& i : ids) i = rng.below(vocab);
  return Tensor::from_indices(ids, {b, t});
}

struct Result {
  uint64_t hash = 0;
  double loss = 0, kept_mb = 0, best_s = 0, median_s = 0;
  std::vector<double> times;
};

// One mode's model and batch.
struct Run {
  Recompute mode;
  std::unique_ptr<model::Transformer> model;
  Tensor tokens, targets;
  Result result;
};

Run make_run(const modtrain::RunConfig& cfg, Recompute mode) {
  const auto& m = cfg.model();
  Run r{mode, std::make_unique<model::Transformer>(m, cfg.train().seed()), {}, {}, {}};
  r.model->set_recompute(
      mode, {cfg.train().recompute_blocks().begin(), cfg.train().recompute_blocks().end()});
  const int64_t b = cfg.train().batch_size();
  r.tokens = tokens_for(b, m.seq_len(), m.vocab_size(), 1);
  r.targets = tokens_for(b, m.seq_len(), m.vocab_size(), 2);
  return r;
}

// One forward + backward; the first also records the check and the memory kept.
void step(Run& r, bool first) {
  r.model->zero_grad();
  const int64_t before = resident_bytes();
  const auto t0 = Clock::now();
  model::ForwardResult f = r.model->forward(r.tokens, r.targets);
  const int64_t after = resident_bytes();
  backward(f.loss);
  const double took = seconds_since(t0);
  if (!first) {
    r.result.times.push_back(took);
    return;
  }
  r.result.loss = f.loss.item();
  r.result.kept_mb = static_cast<double>(after - before) / (1 << 20);
  uint64_t h = hash_bytes(1469598103934665603ull, f.loss);
  for (const auto& [name, p] : r.model->named_parameters()) h = hash_bytes(h, p.grad());
  r.result.hash = h;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  std::vector<std::string> sets;
  int steps = 3;
  std::vector<Recompute> modes = {TrainConfig::NONE, TrainConfig::SELECTIVE, TrainConfig::FULL};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "recompute_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") {
      config_path = value();
    } else if (a == "--set") {
      sets.push_back(value());
    } else if (a == "--steps") {
      steps = std::stoi(value());
    } else if (a == "--mode") {
      Recompute mode;
      const std::string name = value();
      if (!TrainConfig::Recompute_Parse(name, &mode)) {
        std::fprintf(stderr, "recompute_bench: --mode %s is not NONE, SELECTIVE or FULL\n",
                     name.c_str());
        return 2;
      }
      modes = {mode};
    } else {
      std::fprintf(stderr,
                   "usage: recompute_bench --config F [--set field=value]... [--steps N] "
                   "[--mode NONE|SELECTIVE|FULL]\n");
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "recompute_bench: --config is required\n");
    return 2;
  }
  const modtrain::RunConfig cfg = config::load(bench::resolve(config_path), sets);
  const auto& m = cfg.model();
  const int64_t d = m.d_model(), f = m.d_ff();
  std::printf(
      "recompute_bench: %s, d %lld, %d layers, d_ff %lld, seq %d, batch %d, %d timed steps\n",
      config_path.c_str(), static_cast<long long>(d), m.n_layers(), static_cast<long long>(f),
      m.seq_len(), cfg.train().batch_size(), steps);
  std::printf(
      "  napkin, floats kept per token per dense GELU block: NONE 8D+2F = %lld, "
      "SELECTIVE 7D+F = %lld, FULL D = %lld\n",
      static_cast<long long>(8 * d + 2 * f), static_cast<long long>(7 * d + f),
      static_cast<long long>(d));
  std::vector<Run> runs;
  for (Recompute mode : modes) runs.push_back(make_run(cfg, mode));
  for (Run& r : runs) step(r, true);  // the check and the memory, one mode at a time
  // Timed rounds interleave the modes, so that load from other processes falls on all alike.
  for (int s = 0; s < steps; ++s)
    for (Run& r : runs) step(r, false);
  const Run* none = nullptr;
  for (const Run& r : runs)
    if (r.mode == TrainConfig::NONE) none = &r;
  bool all_equal = true;
  for (Run& r : runs) {
    Result& res = r.result;
    std::sort(res.times.begin(), res.times.end());
    if (!res.times.empty()) {
      res.best_s = res.times.front();
      res.median_s = res.times[res.times.size() / 2];
    }
    const bool equal = !none || res.hash == none->result.hash;
    all_equal = all_equal && equal;
    std::printf(
        "  %-9s loss %.6f  gradients vs NONE: %-11s kept after forward %8.1f MB  step "
        "best %.3f s, median %.3f s\n",
        TrainConfig::Recompute_Name(r.mode).c_str(), res.loss,
        !none   ? "not checked"
        : equal ? "equal"
                : "DIFFER",
        res.kept_mb, res.best_s, res.median_s);
  }
  if (!all_equal) return 1;
  return 0;
}
