// parallel_bench: what one training step sends between ranks and how long it waits, for each
// dp x tp (+ ep) layout of tiny_dense and tiny_mod, or of any recipe given with --config (the
// MoE and MoDE recipes get the expert-parallel layouts too), next to the minimum the model
// config implies.
//   ./build/benchmarks/parallel_bench                                   (1 rank: dp1)
//   mpirun -n 2 --oversubscribe --bind-to none ./build/benchmarks/parallel_bench  (dp2, tp2,
//                                                                                   dp2+zero1)
//   mpirun -n 2 --oversubscribe --bind-to none ./build/benchmarks/parallel_bench
//       --config configs/recipes/tiny_mode_integrated.textproto     (the same and dp2+ep2)
//   mpirun -n 4 --oversubscribe ./build/benchmarks/parallel_bench       (dp2xtp2, dp4, tp4)
// As root, add --allow-run-as-root to mpirun. --bind-to none keeps Open MPI from pinning each of
// 2 ranks to one core, which slows the 2-thread 1-rank reference (see main). Figures:
// docs/parallel.md.
//
// Checks before it reports: world rank 0 trains the 1-rank reference alone (on every core, the
// other ranks asleep); each layout's losses must equal it to a relative 1e-5 (the parity tests'
// tolerance), the warm-up steps before the timed run starts, then every step of it.
// Warm-up is excluded by differencing: every configuration is trained by two fresh Trainers,
// for W and for W + N steps, and (second - first) / N is one step, so start-up, the final
// parameter gather and the file writes cancel. Bytes are counted by CountingCommunicator with
// the ring formulas of parallel/counting_communicator.h, per group (dp, edp, tp, ep, world).
//
// Napkin minimum per step and rank; f32 = 4 B, f64 = 8 B; B global batch, T seq_len, D d_model,
// a micro-batches per step; P_local = P_split / tp + P_replicated dense parameters live on a
// rank (P_split: the 4 attention matrices of every block, the 2-3 matrices of every dense MLP,
// the embedding and an untied LM head; P_replicated: norms, MoD and MoE routers, predictors);
// P_expert: the E expert MLPs of every MoE block; E experts, K_b slots per (sequence, expert)
// in block b (moe_routing.h expert_slots of the T_b tokens entering its MLP):
//   dp group  2 (dp - 1) / dp x 4 B x P_local                  ring all-reduce of dense gradients
//             + (dp - 1) / dp x 4 B x P_local with ZeRO-1      all-gather of updated parameters
//   edp group 2 (edp - 1) / edp x 4 B x P_expert / ep          ring all-reduce of expert
//             (+ (edp - 1) / edp x ... with ZeRO-1)            gradients, edp = dp / ep x tp
//             ranks hold the same experts (parallel/mesh.h); the sum is divided by dp
//   tp group  2 (tp - 1) / tp x a x B / dp x [4 B x D x (sum_b w_b + 2 T) + 8 B x 3 T]
//             w_b = 4 T_b for a dense MLP: 4 all-reduces of [B/dp, T_b, D], T_b = T (dense) or
//             C (routed): forward after attn.wo and mlp.down, backward at the shared copy_to_tp
//             of the QKV input and of the MLP input; w_b = 2 T_b + E K_b for an MoE MLP: the
//             attention's 2 and 2 all-gathers ((tp - 1) / tp each) of the [E, B/dp x K_b, D]
//             slots (combine forward, dispatch backward; expert_parallel.h); 2 of [B/dp, T, D]:
//             the vocabulary-parallel embedding (forward) and the tied LM head's input
//             (backward); 3 f64 per token in the vocabulary-parallel cross-entropy.
//   ep group  valid x 4 (ep - 1) / ep x a x 4 B x D x B / dp / tp x sum_b E K_b
//             4 all-to-alls per MoE block (dispatch and combine, forward and backward), each of
//             a rank's [E, B/dp x K_b / tp, D] slots, of which (ep - 1) / ep go to experts on
//             other ranks. Under expert choice every slot holds a token (valid = 1), so the
//             static slots are the minimum; under token choice the empty slots are padding:
//             valid = the measured share of filled slots (the 1-rank reference's routing of
//             the first validation batch after training) and the measurement exceeds the
//             minimum by 1 / valid.
// The dp group also reduces the step's loss and router statistics, the tp and ep groups the
// gradient norm, and every rank agrees each step on whether to stop (world): small, not in the
// minimum.
#if MOD_HAVE_MPI
#include <mpi.h>
#endif
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "benchmarks/parallel_napkin.h"
#include "configs/config.h"
#include "core/autograd.h"
#include "core/device_report.h"
#include "core/random.h"
#include "model/flops.h"
#include "model/routing_schedule.h"
#include "model/transformer.h"
#include "parallel/counting_communicator.h"
#include "parallel/mesh.h"
#include "parallel/world.h"
#include "train/data/loader.h"
#include "train/data/shard.h"
#include "train/trainer.h"

using namespace mod;
using bench::default_layouts;
using bench::fmt;
using bench::Layout;
using bench::Napkin;
using bench::napkin;
using bench::parse_layout;
using parallel::Collective;
using parallel::Communicator;
using parallel::CountingCommunicator;
namespace po = boost::program_options;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kTolerance = 1e-5;  // relative, per step loss (tests/parallel/parity_test.cpp)
const char* const kGroups[] = {"dp", "edp", "tp", "ep", "world"};

Communicator& world() {
  return parallel::world();
}

bool leader() {
  return world().rank() == 0;
}

// Ends every rank of the job; the message names this benchmark.
[[noreturn]] void fail(const std::string& what) {
  world().abort("parallel_bench: " + what, 1);
  std::_Exit(1);  // not reached
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- data, configs, runs ----

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
  p->set_zero1(l.zero1);
  cfg.mutable_train()->set_steps(steps);
  cfg.mutable_train()->set_eval_every(0);
  cfg.mutable_checkpoint()->set_every_steps(0);
  cfg.mutable_checkpoint()->set_every_minutes(0);
  return cfg;
}

struct Run {
  std::vector<double> losses;
  double seconds = 0;  // Trainer::run on this rank
  parallel::Stats stats;
  double valid_share = 1;  // expert slots holding a token (see valid_slot_share)
};

// The share of expert slots that hold a token when the trained model routes the first
// validation batch: 1 under expert choice (every slot filled by construction); under token
// choice sum_b (B x T_b x top_k x (1 - dropped_b)) / sum_b (E x B x K_b). Needs every expert
// on this rank (the 1-rank reference).
double valid_slot_share(const train::Trainer& trainer, const modtrain::RunConfig& cfg) {
  const auto& m = cfg.model();
  if (!m.moe().enabled() || m.moe().routing() != modtrain::MoEConfig::TOKEN_CHOICE) return 1;
  NoGradGuard no_grad;
  const auto splits = train::load_splits(cfg.data().dir(), m.vocab_size());
  const auto batches =
      data::sequential_batches(*splits.val, m.seq_len(), cfg.train().batch_size(), 1);
  const model::ForwardResult r =
      trainer.model().forward(batches.at(0).inputs, batches.at(0).targets);
  const auto slots = bench::expert_slots_by_block(m);
  const double rows = static_cast<double>(cfg.train().batch_size());
  double valid = 0, all = 0;
  for (const model::MoeStats& s : r.moe_stats) {
    const double tb = static_cast<double>(model::block_capacity(m, s.block));
    valid += rows * tb * m.moe().top_k() * (1 - s.dropped_fraction);
    all += rows * m.moe().n_experts() * static_cast<double>(slots[s.block]);
  }
  return all > 0 ? valid / all : 1;
}

// One fresh Trainer on `comm`; `sync` (uncounted) lines the ranks up before the clock starts.
// With `measure_slots` (a 1-rank run), also the trained model's valid expert-slot share.
Run train_once(const modtrain::RunConfig& cfg, CountingCommunicator& comm, Communicator& sync,
               bool measure_slots = false) {
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

// Per-step figures of a layout, averaged over the ranks.
struct StepFigures {
  double seconds = 0, in_calls = 0, waiting = 0;
  std::map<std::string, double> bytes, calls;  // by group
  parallel::Stats rank0;                       // world rank 0's difference, for the breakdown
  double sent() const {
    double s = 0;
    for (const auto& [g, b] : bytes) s += b;
    return s;
  }
  double compute() const { return seconds - in_calls - waiting; }
};

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
// (all_gather: that many bytes out; all_to_all: that many bytes in).
double collective_seconds(Communicator& comm, Collective kind, int64_t tensor_bytes) {
  const int64_t per_rank = std::max<int64_t>(1, tensor_bytes / 4 / comm.size());
  Tensor a = Tensor::zeros({kind == Collective::AllGather ? per_rank : per_rank * comm.size()});
  Tensor out = Tensor::zeros({per_rank * comm.size()});
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    comm.barrier();
    const auto t0 = Clock::now();
    if (kind == Collective::AllGather)
      comm.all_gather(a, out);
    else if (kind == Collective::AllToAll)
      comm.all_to_all(a.view({comm.size(), per_rank}), out.view({comm.size(), per_rank}));
    else
      comm.all_reduce(a);
    if (rep >= 2) best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Seconds per step the layout's dp, edp, tp and ep collectives take when timed alone, one kind
// at a time at its mean message size (world rank 0's counts). Collective over the world.
struct Ceiling {
  double seconds = 0;
  std::string detail;
};
Ceiling comm_ceiling(const parallel::Stats& per_run, int steps, const Layout& l) {
  struct Item {
    const char* group;
    Collective kind;
  };
  const Item items[] = {{"dp", Collective::AllReduceAsync}, {"dp", Collective::AllReduce},
                        {"dp", Collective::AllGather},      {"edp", Collective::AllReduceAsync},
                        {"edp", Collective::AllGather},     {"tp", Collective::AllReduce},
                        {"tp", Collective::AllGather},      {"ep", Collective::AllToAll}};
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

// ---- threads and cores ----

// The 1-minute load average: above ~1 on this 2-core class something else runs, and timings
// (not bytes) are unreliable.
double load_average() {
  double load[1] = {-1};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

int online_cpus() {
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return online_cpus();
  return CPU_COUNT(&set);
}

// For the 1-rank reference inside an mpirun job: this rank may use every core (mpirun -n 2
// binds each rank to one) with `threads` OpenMP threads; both restored at the end of the scope.
class WholeMachine {
 public:
  explicit WholeMachine(int threads) : threads_(omp_get_max_threads()) {
    CPU_ZERO(&saved_);
    saved_ok_ = sched_getaffinity(0, sizeof saved_, &saved_) == 0;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);  // the kernel keeps the CPUs that exist
    omp_set_num_threads(threads);
  }
  ~WholeMachine() {
    omp_set_num_threads(threads_);
    if (saved_ok_) sched_setaffinity(0, sizeof saved_, &saved_);
  }
  WholeMachine(const WholeMachine&) = delete;
  WholeMachine& operator=(const WholeMachine&) = delete;

 private:
  int threads_;
  cpu_set_t saved_;
  bool saved_ok_ = false;
};

// Broadcasts rank 0's f64 tensor while the other ranks sleep 20 ms between polls. The
// communicator's waits poll at least every millisecond, and a few ranks doing that on the cores
// of the 2-thread reference slowed it up to 5x (4 ranks on 2 cores): OpenMP's barriers stall
// whenever a woken process preempts one of its threads.
void broadcast_sleeping(Tensor& t) {
#if MOD_HAVE_MPI
  if (world().size() > 1) {
    MPI_Request request;
    if (MPI_Ibcast(t.raw_data(), static_cast<int>(t.numel()), MPI_DOUBLE, 0, MPI_COMM_WORLD,
                   &request) != MPI_SUCCESS)
      fail("MPI_Ibcast of the reference failed");
    for (int done = 0;;) {
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        fail("MPI_Test on the reference's broadcast failed");
      if (done) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
#endif
  world().broadcast(t, 0);
}

// ---- one model ----

struct Row {
  std::string model, layout;
  double sent = 0, minimum = 0, seconds = 0, compute = 0, in_calls = 0, waiting = 0, ceiling = 0,
         tokens_per_s = 0, vs_one = 1;
};

struct Options {
  int warmup = 2, steps = 6, baseline_threads = 0;
  std::vector<Layout> layouts;  // empty: default_layouts(world size, the config has experts)
};

std::string mb(double bytes) {
  return fmt("%.3f MB", bytes / 1e6);
}

// The per-kind breakdown of one group from rank 0's figures: "2 x all_reduce_async 19.150 MB
// (launch 0.4 ms, waiting 20.1 ms)".
std::string breakdown(const parallel::Stats& d, const std::string& group, int steps) {
  const parallel::GroupStats g = d.group(group);
  // Differences of two runs: a few microseconds of noise can come out below zero.
  auto ms = [steps](double seconds) { return std::max(0.0, 1e3 * seconds / steps); };
  std::string out;
  for (size_t k = 0; k < parallel::kCollectiveCount; ++k) {
    const auto& s = g.by_kind[k];
    if (s.calls == 0) continue;
    const auto kind = static_cast<Collective>(k);
    if (!out.empty()) out += ", ";
    out += fmt("%.3g x ", static_cast<double>(s.calls) / steps) + parallel::collective_name(kind) +
           " " + mb(static_cast<double>(s.bytes_sent) / steps);
    out += kind == Collective::AllReduceAsync
               ? fmt(" (launch %.1f ms, waiting %.1f ms)", ms(s.seconds), ms(s.wait_seconds))
               : fmt(" (%.1f ms)", ms(s.seconds));
  }
  return out.empty() ? "-" : out;
}

// Why layout `l` cannot train `cfg` ("" when it can): the mesh's checks, the batch split over
// dp, and every MoE block's slots split over tp (expert_parallel.h).
std::string misfit(const modtrain::RunConfig& cfg, const Layout& l) {
  try {
    const parallel::ParallelDims dims{l.dp, l.tp, l.ep};
    dims.validate(l.dp * l.tp);
    dims.validate_model(cfg.model());
  } catch (const std::exception& e) {
    return e.what();
  }
  const int b = cfg.train().batch_size();
  if (b % l.dp != 0) return fmt("train.batch_size %.0f is not divisible by dp %.0f", b, l.dp);
  for (int64_t k : bench::expert_slots_by_block(cfg.model()))
    if (k > 0 && (b / l.dp * k) % l.tp != 0)
      return fmt("an MoE block's B/dp x K = %.0f x %.0f slots are not divisible by tp %.0f",
                 b / l.dp, static_cast<double>(k), l.tp);
  return "";
}

std::vector<Row> bench_model(const std::string& path, const modtrain::RunConfig& base,
                             const Options& o) {
  const auto& m = base.model();
  const int n = world().size();
  const bool experts = m.moe().enabled();
  const double tokens =
      static_cast<double>(base.train().batch_size()) * base.train().grad_accum() * m.seq_len();
  const Napkin ref_napkin = napkin(base, Layout{});
  int routed = 0;
  for (bool r : model::routed_blocks(m)) routed += r;
  if (leader()) {
    std::printf(
        "\n== %s (%s): %d layers (%d routed), D %d, H %d, F %d, V %d; %.3fM parameters, "
        "%.3fM of them split by tp; global batch %d x %d = %.0f tokens/step ==\n",
        base.name().c_str(), path.c_str(), m.n_layers(), routed, m.d_model(), m.n_heads(), m.d_ff(),
        m.vocab_size(), ref_napkin.params / 1e6, ref_napkin.split / 1e6, base.train().batch_size(),
        m.seq_len(), tokens);
    if (experts) {
      std::string k;
      for (int64_t x : bench::expert_slots_by_block(m)) {
        if (!k.empty()) k += ' ';
        k += std::to_string(x);
      }
      const bool tc = m.moe().routing() == modtrain::MoEConfig::TOKEN_CHOICE;
      std::printf(
          "   MoE: E = %d experts, %s%s; %.3fM expert parameters; slots K_b per (sequence, "
          "expert) by block: %s\n",
          m.moe().n_experts(), tc ? "token choice" : "expert choice",
          m.moe().noop_expert() ? " + a no-op expert" : "", ref_napkin.expert / 1e6, k.c_str());
    }
  }

  // Napkin check: the config's parameter count is the built model's.
  {
    model::Transformer built(m, 0);
    int64_t count = 0;
    for (const auto& [name, p] : built.named_parameters()) count += p.numel();
    const bool ok = count == ref_napkin.params;
    if (leader())
      std::printf("  check parameter count from the config %lld = the built model's %lld  %s\n",
                  static_cast<long long>(ref_napkin.params), static_cast<long long>(count),
                  ok ? "ok" : "WRONG");
    if (!ok) fail("count_flops(cfg).parameters disagrees with the built model");
  }

  // The 1-rank reference: on world rank 0 alone when there are other ranks.
  const int w = o.warmup, total = o.warmup + o.steps;
  const Layout one{1, 1, 1, false};
  // losses, step seconds, deterministic, valid expert-slot share
  std::vector<double> ref(static_cast<size_t>(total) + 3);
  int ref_threads = omp_get_max_threads();
  if (leader()) {
    std::unique_ptr<WholeMachine> machine;
    if (n > 1) {
      ref_threads = o.baseline_threads > 0 ? o.baseline_threads : online_cpus();
      machine = std::make_unique<WholeMachine>(ref_threads);
    }
    CountingCommunicator solo(parallel::make_local_communicator());
    const Run a = train_once(layout_config(base, one, w), solo, solo);
    const Run b = train_once(layout_config(base, one, total), solo, solo, /*measure_slots=*/true);
    std::copy(b.losses.begin(), b.losses.end(), ref.begin());
    ref[total] = (b.seconds - a.seconds) / o.steps;
    ref[total + 1] = std::equal(a.losses.begin(), a.losses.end(), b.losses.begin()) ? 1 : 0;
    ref[total + 2] = b.valid_share;
  }
  if (n > 1) {
    Tensor t = Tensor::from_vector(ref, {static_cast<int64_t>(ref.size())}, DType::F64);
    broadcast_sleeping(t);  // the other ranks wait here, asleep, while rank 0 trains
    ref = t.to_vector();
  }
  const std::vector<double> ref_losses(ref.begin(), ref.begin() + total);
  const double ref_step = ref[total], valid_share = ref[total + 2];
  bool finite = true;
  for (double x : ref_losses) finite = finite && std::isfinite(x);
  const bool learns = ref_losses.back() < ref_losses.front();
  const bool deterministic = ref[total + 1] == 1;
  if (leader()) {
    std::printf(
        "1 rank x %d thread%s%s: %d steps, losses %.4f -> %.4f (finite %s, falling %s); "
        "first %d equal bitwise in a second run: %s\n",
        ref_threads, ref_threads == 1 ? "" : "s",
        n > 1 ? " (world rank 0 alone on every core, the other ranks asleep)" : "", total,
        ref_losses.front(), ref_losses.back(), finite ? "ok" : "WRONG", learns ? "ok" : "WRONG", w,
        deterministic ? "ok" : "WRONG");
    std::printf("  step %.1f ms | %.0f tok/s\n", 1e3 * ref_step, tokens / ref_step);
    if (experts && m.moe().routing() == modtrain::MoEConfig::TOKEN_CHOICE)
      std::printf(
          "  token choice: %.1f%% of the expert slots hold a token (the trained reference "
          "routing the first validation batch): the static slots send %.3fx the minimum\n",
          100 * valid_share, 1 / valid_share);
    else if (experts)
      std::printf(
          "  expert choice: every expert slot holds a token, so the static slots are the "
          "minimum (padding 1x)\n");
  }
  if (!finite || !learns || !deterministic) fail(base.name() + ": the 1-rank reference is wrong");

  std::vector<Row> rows;
  rows.push_back({base.name(), n > 1 ? "1 rank" : "dp1", 0, 0, ref_step, ref_step, 0, 0, 0,
                  tokens / ref_step, 1.0});
  CountingCommunicator counted(world());
  const std::vector<Layout> layouts = o.layouts.empty() ? default_layouts(n, experts) : o.layouts;
  for (const Layout& l : layouts) {
    if (n == 1) break;  // a world of one: dp1 is the reference above
    if (const std::string why = misfit(base, l); !why.empty()) {
      if (leader())
        std::printf("\nlayout %s: skipped, it does not fit: %s\n", l.label().c_str(), why.c_str());
      continue;
    }
    const Napkin nk = napkin(base, l, valid_share);
    if (leader())
      std::printf("\nlayout %s (%d ranks x %d thread%s):\n", l.label().c_str(), n,
                  omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
    const Run a = train_once(layout_config(base, l, w), counted, world());
    check_losses(l.label() + " warm-up", a.losses, ref_losses);
    const Run b = train_once(layout_config(base, l, total), counted, world());
    check_losses(l.label(), b.losses, ref_losses);
    const StepFigures f = per_step(a, b, o.steps);
    const Ceiling ceiling = comm_ceiling(f.rank0, o.steps, l);
    const double minimum = nk.total();
    if (leader()) {
      // Per group: measured (mean over ranks) next to the minimum, rank 0's calls, the formula.
      const std::map<std::string, std::pair<double, std::string>> minima = {
          {"dp",
           {nk.dp_bytes, l.dp > 1 ? nk.dp_formula + "\n" + std::string(24, ' ') + nk.params_formula
                                  : "(dp = 1)"}},
          {"edp", {nk.edp_bytes, nk.edp > 1 ? nk.edp_formula : "(edp = dp / ep x tp = 1)"}},
          {"tp", {nk.tp_bytes, l.tp > 1 ? nk.tp_formula : "(tp = 1)"}},
          {"ep", {nk.ep_bytes, l.ep > 1 ? nk.ep_formula : "(ep = 1)"}},
          {"world", {0, "(small control messages, not in the minimum)"}}};
      for (const char* g : kGroups) {
        if (!experts && (std::string(g) == "edp" || std::string(g) == "ep")) continue;
        const auto& [min_bytes, formula] = minima.at(g);
        const double sent = f.bytes.at(g);
        std::printf("  %-5s sent %12s  minimum %12s  %s  rank 0: %s\n", g, mb(sent).c_str(),
                    mb(min_bytes).c_str(),
                    min_bytes > 0 ? fmt("(%.4fx)", sent / min_bytes).c_str() : "         ",
                    breakdown(f.rank0, g, o.steps).c_str());
        std::printf("        minimum = %s\n", formula.c_str());
      }
      if (l.zero1)
        std::printf(
            "  (a ZeRO-1 that reduce-scattered the gradients instead of all-reducing them "
            "would send %s, as much as plain dp)\n",
            mb((nk.dp_bytes + nk.edp_bytes) * 2 / 3).c_str());
      std::printf("  measured / minimum: %.4fx (%s sent of %s)\n", f.sent() / minimum,
                  mb(f.sent()).c_str(), mb(minimum).c_str());
      std::printf(
          "  ceiling        the same collectives alone on this machine (best of 5 at the "
          "mean message size): %.1f ms per step (%s)\n",
          1e3 * ceiling.seconds, ceiling.detail.c_str());
      std::printf(
          "  step %.1f ms = compute %.1f + in calls %.1f + waiting %.1f | %.0f tok/s | "
          "%.2fx the 1-rank run\n",
          1e3 * f.seconds, 1e3 * f.compute(), 1e3 * f.in_calls, 1e3 * f.waiting, tokens / f.seconds,
          ref_step / f.seconds);
      std::fflush(stdout);
    }
    rows.push_back({base.name(), l.label(), f.sent(), minimum, f.seconds, f.compute(), f.in_calls,
                    f.waiting, ceiling.seconds, tokens / f.seconds, ref_step / f.seconds});
  }
  return rows;
}

// --napkin-only: the minimum of each layout that fits the model, with its formulas. Token
// choice is counted as if every slot held a token (valid = 1: no measurement without training).
void print_napkins(const modtrain::RunConfig& cfg, const std::vector<Layout>& layouts) {
  const auto& m = cfg.model();
  std::printf(
      "\n== %s: D %d, %d layers, F %d, V %d, T %d, global batch %d x %d micro-batches "
      "==\n",
      cfg.name().c_str(), m.d_model(), m.n_layers(), m.d_ff(), m.vocab_size(), m.seq_len(),
      cfg.train().batch_size(), cfg.train().grad_accum());
  for (const Layout& l : layouts) {
    if (const std::string why = misfit(cfg, l); !why.empty()) {
      std::printf("%-14s does not fit: %s\n", l.label().c_str(), why.c_str());
      continue;
    }
    const Napkin nk = napkin(cfg, l);
    std::printf("%-14s %s per step and rank: dp %s, edp %s, tp %s, ep %s\n", l.label().c_str(),
                mb(nk.total()).c_str(), mb(nk.dp_bytes).c_str(), mb(nk.edp_bytes).c_str(),
                mb(nk.tp_bytes).c_str(), mb(nk.ep_bytes).c_str());
    if (l.dp > 1)
      std::printf("    dp:  %s\n         %s\n", nk.dp_formula.c_str(), nk.params_formula.c_str());
    if (nk.edp > 1 && nk.expert > 0) std::printf("    edp: %s\n", nk.edp_formula.c_str());
    if (l.tp > 1) std::printf("    tp:  %s\n", nk.tp_formula.c_str());
    if (l.ep > 1) std::printf("    ep:  %s\n", nk.ep_formula.c_str());
  }
}

std::string resolve(const std::string& path) {
  if (fs::exists(path) || fs::path(path).is_absolute()) return path;
  const std::string in_source = std::string(MOD_SOURCE_DIR) + "/" + path;
  return fs::exists(in_source) ? in_source : path;
}

}  // namespace

int main(int argc, char** argv) {
  parallel::init_world(&argc, &argv);
  po::options_description desc("parallel_bench options");
  desc.add_options()("help", "show this help")(
      "config",
      po::value<std::vector<std::string>>()->composing()->default_value(
          {"configs/recipes/tiny_dense.textproto", "configs/recipes/tiny_mod.textproto"},
          "tiny_dense and tiny_mod"),
      "RunConfig recipe (repeatable)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override for every config: path.to.field=value (repeatable)")(
      "layouts", po::value<std::string>()->default_value(""),
      "comma-separated, e.g. dp2,tp2,dp2+zero1,dp2xtp2,dp2+ep2 (default: the world size's)")(
      "steps", po::value<int>()->default_value(6), "timed steps per layout")(
      "warmup", po::value<int>()->default_value(2), "warm-up steps per layout, not timed")(
      "data", po::value<std::string>()->default_value(""),
      "prepared corpus directory (default: a synthetic Markov-chain corpus)")(
      "threads-per-rank", po::value<int>()->default_value(0),
      "OpenMP threads per rank (default: 1 under mpirun, all cores alone)")(
      "baseline-threads", po::value<int>()->default_value(0),
      "threads of the 1-rank reference inside an mpirun job (default: every online CPU)")(
      "napkin-only",
      "print the minimum bytes of --layouts for the configs and exit (no training; "
      "any layout, e.g. dp8,dp4xtp2,dp8+ep4 for a cluster)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv)
                  .options(desc)
                  .style(po::command_line_style::unix_style ^ po::command_line_style::allow_short)
                  .run(),
              vm);
    if (vm.count("help")) {
      if (leader())
        std::cout << "usage: [mpirun -n N --oversubscribe --bind-to none] parallel_bench\n"
                     "         [--config F ...] [--set f=v ...] [--layouts L,...]\n"
                  << desc << "\n";
      parallel::finalize_world();
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    if (leader()) std::fprintf(stderr, "parallel_bench: %s (see --help)\n", e.what());
    parallel::finalize_world();
    return 2;
  }

  try {
    const int n = world().size();
    Options o;
    o.steps = vm["steps"].as<int>();
    o.warmup = vm["warmup"].as<int>();
    o.baseline_threads = vm["baseline-threads"].as<int>();
    if (o.steps < 1 || o.warmup < 1) fail("--steps and --warmup must be >= 1");
    std::vector<std::string> sets;
    if (vm.count("set")) sets = vm["set"].as<std::vector<std::string>>();
    const std::string layouts = vm["layouts"].as<std::string>();
    if (!layouts.empty()) {
      std::stringstream ss(layouts);
      std::string item;
      while (std::getline(ss, item, ',')) o.layouts.push_back(parse_layout(item));
    }
    std::vector<std::string> configs = vm["config"].as<std::vector<std::string>>();
    if (vm.count("napkin-only")) {
      if (leader())
        for (const std::string& path : configs) {
          const modtrain::RunConfig cfg = config::load(resolve(path), sets);
          print_napkins(
              cfg, o.layouts.empty() ? default_layouts(n, cfg.model().moe().enabled()) : o.layouts);
        }
      parallel::finalize_world();
      return 0;
    }
    for (const Layout& l : o.layouts)
      if (l.dp * l.tp != n)
        fail("layout " + l.label() + " needs dp x tp = " + std::to_string(l.dp) + " x " +
             std::to_string(l.tp) + " = " + std::to_string(l.dp * l.tp) + " ranks, the world has " +
             std::to_string(n));

    // Threads: one per rank under mpirun. More threads than cores make OpenMP's spinning
    // workers and the ranks' polling waits take cores from each other.
    int threads = vm["threads-per-rank"].as<int>();
    if (threads <= 0 && n > 1) threads = 1;
    if (threads > 0) {
      omp_set_num_threads(threads);
      // OpenBLAS reads the variable when it loads (at the first GEMM, below); later calls follow
      // omp_set_num_threads, but its own report would show the start-up count.
      setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
    }
    Tensor cpus = Tensor::from_vector({static_cast<double>(allowed_cpus())}, {1}, DType::F64);
    world().all_reduce(cpus, parallel::ReduceOp::Min);
    const double start_load = load_average();
    const double peak = train::measured_peak_flops();  // once, before anything is timed
    if (leader()) {
      std::printf("parallel_bench: %d rank%s (%s) on %d online CPUs; %d OpenMP thread%s per rank\n",
                  n, n == 1 ? "" : "s", parallel::launch_info().source.c_str(), online_cpus(),
                  omp_get_max_threads(), omp_get_max_threads() == 1 ? "" : "s");
      std::printf("%s\nSGEMM 1024^3 on rank 0: %.1f GFLOP/s; load average (1 min) %.2f%s\n",
                  device_report().c_str(), peak / 1e9, start_load,
                  start_load > 1 ? ": the machine is busy, timings will be noisy" : "");
      if (n > 1) {
        std::printf(
            "threads: OMP_NUM_THREADS=1 per rank (omp_set_num_threads; --threads-per-rank "
            "to change): with %d ranks on %d CPUs, more threads than cores would make "
            "OpenMP's spinning workers and the ranks' polling waits fight for cores.\n",
            n, online_cpus());
        if (cpus.at(0) < online_cpus())
          std::printf(
              "binding: mpirun bound a rank to %.0f of %d CPUs; rank 0 widens its own "
              "mask to every CPU for the 1-rank reference and restores it after, but libgomp "
              "counted the CPUs at start-up and now throttles its spin-waits, which slowed the "
              "2-thread reference by up to 1.7x: for the scaling figures run mpirun "
              "--bind-to none.\n",
              cpus.at(0), online_cpus());
      }
      std::printf(
          "timing: per step = (run of %d + %d steps - run of %d steps) / %d, fresh "
          "trainers, so warm-up and start-up cancel; bytes per rank as the ring "
          "algorithms send them (parallel/counting_communicator.h); 'in calls' is time "
          "inside collectives (waiting for slower peers included), 'waiting' is time "
          "blocked in Work::wait of the overlapped dp all-reduce; step figures are means over "
          "the ranks, the per-collective breakdown is rank 0's.\n",
          o.warmup, o.steps, o.warmup, o.steps);
    }

    const std::string data_dir = vm["data"].as<std::string>();
    std::map<uint32_t, std::string> corpora;  // vocabulary -> synthetic corpus directory
    std::vector<Row> rows;
    for (const std::string& path : configs) {
      modtrain::RunConfig cfg = config::load(resolve(path), sets);
      if (!data_dir.empty()) {
        cfg.mutable_data()->set_dir(data_dir);
      } else {
        const auto vocab = static_cast<uint32_t>(cfg.model().vocab_size());
        if (!corpora.count(vocab)) {
          corpora[vocab] = make_temp_dir("data");
          write_corpus(corpora[vocab], vocab);
        }
        cfg.mutable_data()->set_dir(corpora[vocab]);
      }
      for (Row& r : bench_model(path, cfg, o)) rows.push_back(r);
    }
    for (const auto& [vocab, dir] : corpora) fs::remove_all(dir);

    if (leader()) {
      std::printf("\n== summary: per step and rank (MB sent over dp + edp + tp + ep + world) ==\n");
      std::printf("%-20s %-13s %8s %8s %7s %8s %8s %8s %8s %8s %7s %9s\n", "model", "layout",
                  "sent MB", "min MB", "ratio", "step ms", "compute", "calls", "waiting", "ceiling",
                  "tok/s", "vs 1 rank");
      for (const Row& r : rows)
        std::printf("%-20s %-13s %8.3f %8.3f %7s %8.1f %8.1f %8.1f %8.1f %8.1f %7.0f %8.2fx\n",
                    r.model.c_str(), r.layout.c_str(), r.sent / 1e6, r.minimum / 1e6,
                    r.minimum > 0 ? fmt("%.4f", r.sent / r.minimum).c_str() : "-", 1e3 * r.seconds,
                    1e3 * r.compute, 1e3 * r.in_calls, 1e3 * r.waiting, 1e3 * r.ceiling,
                    r.tokens_per_s, r.vs_one);
      std::printf(
          "(ms per step: compute = step - calls - waiting; calls: inside collectives; "
          "waiting: in Work::wait; ceiling: the same collectives timed alone)\n");
      std::printf("load average (1 min): %.2f at the start, %.2f at the end\n", start_load,
                  load_average());
      if (n > 1) {
        std::printf(
            "\nscaling 1 -> %d ranks on a %d-core machine (tokens/s over the 1-rank run "
            "on every core, same job):",
            n, online_cpus());
        for (const Row& r : rows)
          if (r.layout != "1 rank")
            std::printf(" %s %s %.2fx;", r.model.c_str(), r.layout.c_str(), r.vs_one);
        std::printf("\n");
      } else {
        std::printf(
            "\n1 rank: the reference only; run under mpirun -n 2 --oversubscribe for "
            "the layouts and the scaling\n");
      }
    }
  } catch (const std::exception& e) {
    parallel::abort_on_exception(e);
  }
  parallel::finalize_world();
  return 0;
}
