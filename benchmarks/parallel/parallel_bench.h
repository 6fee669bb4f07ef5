// The parts of parallel_bench and what they share: the runs it trains and measures
// (parallel_runs.cpp), the cores its ranks use (parallel_machine.cpp), one model over every
// layout (parallel_model.cpp) and the command itself (parallel_bench.cpp). Every rank calls
// these in the same order: most of them are collective over the world.
#pragma once

#include <sched.h>

#include <map>
#include <string>
#include <vector>

#include "benchmarks/parallel/parallel_napkin.h"
#include "benchmarks/parallel/parallel_step_time.h"
#include "configs/modtrain.pb.h"
#include "core/tensor.h"
#include "parallel/counting_communicator.h"

namespace mod::bench {

// The communicator groups parallel_bench reports, in the order of its tables.
inline constexpr const char* kGroups[] = {"dp", "edp", "tp", "ep", "world"};

bool leader();  // world rank 0, which prints
// Ends every rank of the job; the message names this benchmark.
[[noreturn]] void fail(const std::string& what);

// ---- runs (parallel_runs.cpp) ----

// A fresh directory under the system's temporary one, named by tag and world rank.
std::string make_temp_dir(const std::string& tag);
// A byte-level corpus with structure (a random first-order Markov chain), the same on every rank.
void write_corpus(const std::string& dir, uint32_t vocab);
// cfg laid out as l, training `steps` steps with no evaluation and no checkpoints.
modtrain::RunConfig layout_config(modtrain::RunConfig cfg, const Layout& l, int steps);

struct Run {
  std::vector<double> losses;
  double seconds = 0;  // Trainer::run on this rank
  parallel::Stats stats;
  double valid_share = 1;  // expert slots holding a token (see valid_slot_share)
};
// One fresh Trainer on `comm`; `sync` (uncounted) lines the ranks up before the clock starts.
// With `measure_slots` (a 1-rank run), also the trained model's valid expert-slot share.
Run train_once(const modtrain::RunConfig& cfg, parallel::CountingCommunicator& comm,
               parallel::Communicator& sync, bool measure_slots = false);
// Fails the job unless `got` is finite and equals the 1-rank losses to the parity tolerance.
void check_losses(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& ref);

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
// (b - a) / steps of two runs of the same layout, W and W + steps long. Collective.
StepFigures per_step(const Run& a, const Run& b, int steps);

// Seconds per step the layout's collectives take when timed alone on this machine.
struct Ceiling {
  double seconds = 0;
  std::string detail;
};
Ceiling comm_ceiling(const parallel::Stats& per_run, int steps, const Layout& l);

// ---- threads and cores (parallel_machine.cpp) ----

int online_cpus();
int allowed_cpus();  // the CPUs this process may run on (mpirun may bind it to fewer)

// For the 1-rank reference inside an mpirun job: this rank may use every core (mpirun -n 2
// binds each rank to one) with `threads` OpenMP threads; both restored at the end of the scope.
class WholeMachine {
 public:
  explicit WholeMachine(int threads);
  ~WholeMachine();
  WholeMachine(const WholeMachine&) = delete;
  WholeMachine& operator=(const WholeMachine&) = delete;

 private:
  int threads_;
  cpu_set_t saved_;
  bool saved_ok_ = false;
};

// Broadcasts rank 0's f64 tensor while the other ranks sleep between polls.
void broadcast_sleeping(Tensor& t);

// ---- one model over every layout (parallel_model.cpp) ----

// One line of the summary table.
struct Row {
  std::string model, layout;
  double sent = 0, minimum = 0, seconds = 0, compute = 0, in_calls = 0, waiting = 0, ceiling = 0,
         tokens_per_s = 0, vs_one = 1;
};

struct Options {
  int warmup = 2, steps = 6, baseline_threads = 0;
  std::vector<Layout> layouts;  // empty: default_layouts(world size, the config has experts)
};

// The 1-rank reference, then every layout of the world size that fits: checked, measured and
// printed; one row each.
std::vector<Row> bench_model(const std::string& path, const modtrain::RunConfig& base,
                             const Options& o);
// --napkin-only: the minimum of each layout that fits the model, with its formulas; with a
// fabric (--fabric) also the predicted step time of each, without and with overlap.
void print_napkins(const modtrain::RunConfig& cfg, const std::vector<Layout>& layouts,
                   const Fabric* fabric = nullptr);

}  // namespace mod::bench
