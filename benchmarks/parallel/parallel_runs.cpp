// parallel_bench's runs: the synthetic corpus, one layout's config, one fresh Trainer measured
// on a counting communicator, the parity check against the 1-rank losses, per-step differences
// and the ceiling (the same collectives alone). Collective calls run on every rank alike.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <string>
#include <vector>

#include "benchmarks/bench_common.h"
#include "benchmarks/parallel/parallel_bench.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/routing_schedule.h"
#include "model/transformer.h"
#include "parallel/mesh.h"
#include "parallel/world.h"
#include "train/data/loader.h"
#include "train/data/token_file.h"
#include "train/trainer.h"

namespace mod::bench {

using parallel::Collective;
using parallel::Communicator;
using parallel::CountingCommunicator;
using parallel::world;
namespace fs = std::filesystem;

namespace {
constexpr double kTolerance = 1e-5;  // relative, per step loss (tests/parallel/parity_test.cpp)
}  // namespace

std::string make_temp_dir(const std::string& tag) {
  std::string pattern = (fs::temp_directory_path() / ("modtrain_parallel_bench_" + tag + "_r" +
                                                      std::to_string(world().rank()) + "_XXXXXX"))
                            .string();
  if (::mkdtemp(pattern.data()) == nullptr) fail("cannot create a directory like " + pattern);
  return pattern;
}

// A byte-level corpus with structure (a random first-order Markov chain, each symbol with 4
// likely successors), the same on every rank, so losses fall within a few steps; as in
// tests/parallel/parity_test.cpp.
void write_corpus(const std::string& dir, uint32_t vocab) {
  Rng rng(7);
  std::vector<uint32_t> next(static_cast<size_t>(vocab) * 4);
  for (auto& x : next) x = static_cast<uint32_t>(rng.below(vocab));
  auto chain = [&](size_t n) {
    std::vector<uint32_t> t(n);
    uint32_t s = 0;
    for (auto& x : t) {
      s = rng.below(8) == 0 ? static_cast<uint32_t>(rng.below(vocab)) : next[s * 4 + rng.below(4)];
      x = s;
    }
    return t;
  };
  data::write_shard(dir + "/train.bin", chain(400000), vocab);
  data::write_shard(dir + "/val.bin", chain(20000), vocab);
}

modtrain::RunConfig layout_config(modtrain::RunConfig cfg, const Layout& l, int steps) {
  auto* p = cfg.mutable_parallel();
  p->set_dp(l.dp);
  p->set_tp(l.tp);
  p->set_ep(l.ep);
  p->set_zero_stage(l.zero_stage);
  p->set_sequence_parallel(l.sp);
  cfg.mutable_train()->set_steps(steps);
  cfg.mutable_train()->set_eval_every(0);
  cfg.mutable_checkpoint()->set_every_steps(0);
  cfg.mutable_checkpoint()->set_every_minutes(0);
  return cfg;
}

// The share of expert slots that hold a token when the trained model routes the first
// validation batch: 1 under expert choice (every slot filled by construction); under token
// choice sum_b (B x T_b x top_k x (1 - dropped_b)) / sum_b (E x B x K_b). Needs every expert
// on this rank (the 1-rank reference).
double valid_slot_share(const train::Trainer& trainer, const modtrain::RunConfig& cfg) {
  const auto& m = cfg.model();
  if (!m.moe().enabled() || m.moe().routing() != modtrain::MoEConfig::TOKEN_CHOICE) return 1;
  NoGradGuard no_grad;
  const auto splits = train::load_dataset(cfg.data().dir(), m.vocab_size());
  const auto batches =
      data::sequential_batches(splits.val, m.seq_len(), cfg.train().batch_size(), 1);
  const model::ForwardResult r =
      trainer.model().forward(batches.at(0).inputs, batches.at(0).targets);
  const auto slots = bench::expert_slots_by_block(m);
  const auto capacities = model::block_capacities(m);
  const double rows = static_cast<double>(cfg.train().batch_size());
  double valid = 0, all = 0;
  for (const model::MoeStats& s : r.moe_stats) {
    const double tb = static_cast<double>(capacities[s.block]);
    valid += rows * tb * m.moe().top_k() * (1 - s.dropped_fraction);
    all += rows * m.moe().n_experts() * static_cast<double>(slots[s.block]);
  }
  return all > 0 ? valid / all : 1;
}

Run train_once(const modtrain::RunConfig& cfg, CountingCommunicator& comm, Communicator& sync,
               bool measure_slots) {
  const std::string dir = make_temp_dir("run");
  Run r;
  {
    train::Trainer trainer(cfg, dir, /*quiet=*/true, comm);
    sync.barrier();
    comm.reset_stats();
    const auto t0 = Clock::now();
    trainer.run();
    r.seconds = seconds_since(t0);
    r.stats = comm.stats();
    r.losses = trainer.losses();
    if (measure_slots) r.valid_share = valid_slot_share(trainer, cfg);
  }
  fs::remove_all(dir);
  return r;
}

// Largest |got - want| / |want| over the first got.size() steps.
double max_rel_diff(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-30));
  return worst;
}

void check_losses(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& ref) {
  const double diff = max_rel_diff(got, ref);
  bool finite = true;
  for (double x : got) finite = finite && std::isfinite(x);
  const bool ok = finite && got.size() <= ref.size() && diff <= kTolerance;
  if (leader())
    std::printf(
        "  check %s: %zu losses vs the 1-rank run: max |diff| / |ref| %.1e (tolerance "
        "%.0e)  %s\n",
        what.c_str(), got.size(), diff, kTolerance, ok ? "ok" : "WRONG");
  if (!ok) fail(what + ": losses differ from the 1-rank run; not timing it");
}

StepFigures per_step(const Run& a, const Run& b, int steps) {
  const parallel::Stats d = b.stats - a.stats;
  const parallel::CollectiveStats total = d.total();
  std::vector<double> v = {b.seconds - a.seconds, total.seconds, total.wait_seconds};
  for (const char* g : kGroups) {
    const auto s = d.group(g).total();
    v.push_back(static_cast<double>(s.bytes_sent));
    v.push_back(static_cast<double>(s.calls));
  }
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64);
  world().all_reduce(t);
  const double scale = 1.0 / (world().size() * static_cast<double>(steps));
  StepFigures f;
  f.seconds = t.at(0) * scale;
  f.in_calls = std::max(0.0, t.at(1) * scale);  // differences: noise may dip below zero
  f.waiting = std::max(0.0, t.at(2) * scale);
  size_t k = 3;
  for (const char* g : kGroups) {
    f.bytes[g] = t.at(static_cast<int64_t>(k++)) * scale;
    f.calls[g] = t.at(static_cast<int64_t>(k++)) * scale;
  }
  f.rank0 = d;
  return f;
}

// ---- the ceiling: the same collectives alone on this machine ----

// Best of 5 blocking calls (after 2 untimed) of `kind` moving `tensor_bytes` of f32 on `comm`
// (all_gather: that many bytes out; all_to_all and reduce_scatter: that many bytes in).
double collective_seconds(Communicator& comm, Collective kind, int64_t tensor_bytes) {
  const int64_t per_rank = std::max<int64_t>(1, tensor_bytes / 4 / comm.size());
  const bool gather = kind == Collective::AllGather || kind == Collective::AllGatherAsync;
  Tensor a = Tensor::zeros({gather ? per_rank : per_rank * comm.size()});
  Tensor out = Tensor::zeros({per_rank * comm.size()});
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    comm.barrier();
    const auto t0 = Clock::now();
    if (gather)
      comm.all_gather(a, out);
    else if (kind == Collective::AllToAll)
      comm.all_to_all(a.view({comm.size(), per_rank}), out.view({comm.size(), per_rank}));
    else if (kind == Collective::ReduceScatterAsync || kind == Collective::ReduceScatter)
      comm.reduce_scatter(a, out.narrow0(0, per_rank));
    else
      comm.all_reduce(a);
    if (rep >= 2) best = std::min(best, seconds_since(t0));
  }
  return best;
}

// One kind of collective at a time at its mean message size (world rank 0's counts).
Ceiling comm_ceiling(const parallel::Stats& per_run, int steps, const Layout& l) {
  struct Item {
    const char* group;
    Collective kind;
  };
  const Item items[] = {{"dp", Collective::AllReduceAsync},  {"dp", Collective::ReduceScatterAsync},
                        {"dp", Collective::AllReduce},       {"dp", Collective::AllGather},
                        {"dp", Collective::AllGatherAsync},  {"tp", Collective::ReduceScatter},
                        {"edp", Collective::AllReduceAsync}, {"edp", Collective::ReduceScatterAsync},
                        {"edp", Collective::AllGather},      {"tp", Collective::AllReduce},
                        {"tp", Collective::AllGather},       {"ep", Collective::AllToAll}};
  std::vector<double> v;  // calls per step, mean tensor bytes; rank 0's, sent to all ranks
  for (const Item& it : items) {
    const parallel::CollectiveStats s = per_run.group(it.group)[it.kind];
    v.push_back(static_cast<double>(s.calls) / steps);
    v.push_back(s.calls ? static_cast<double>(s.tensor_bytes) / static_cast<double>(s.calls) : 0);
  }
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64);
  world().broadcast(t, 0);
  parallel::Mesh mesh(world(), parallel::ParallelDims{l.dp, l.tp, l.ep});
  auto group = [&mesh](const std::string& name) -> Communicator& {
    return name == "dp"    ? mesh.dp()
           : name == "edp" ? mesh.edp()
           : name == "tp"  ? mesh.tp()
                           : mesh.ep();
  };
  Ceiling c;
  for (size_t i = 0; i < std::size(items); ++i) {
    const double calls = t.at(static_cast<int64_t>(2 * i)),
                 bytes = t.at(static_cast<int64_t>(2 * i + 1));
    Communicator& g = group(items[i].group);
    if (calls == 0 || g.size() == 1) continue;  // a group of one sends nothing
    const double each = collective_seconds(g, items[i].kind, static_cast<int64_t>(bytes));
    c.seconds += calls * each;
    if (!c.detail.empty()) c.detail += ", ";
    c.detail += fmt("%.3g x ", calls) + items[i].group + " " +
                parallel::collective_name(items[i].kind) +
                fmt(" of %.3f MB: %.2f ms each", bytes / 1e6, 1e3 * each);
  }
  return c;
}

}  // namespace mod::bench
