// The four `modtrain grid` commands, one function each, behind the launcher's option parsing
// (docs/grids.md). Every command expands the spec afresh (grid/expand.h), so point names, step
// counts and Slurm array indices are the same for plan, run, submit and collect of one spec.
// Layout under the output directory OUT:
//   plan.csv, points/<point>.textproto   one RunConfig per runnable point (plan, run, submit)
//   runs/<point>/                        each point's run directory (the trainer's)
//   logs/                                training logs (run: <point>.log; Slurm: task_<i>.out)
//   grid.sbatch, modtrain_job.sh         the job-array script and the protocol it sources
//   results.csv, *.png, plots/           collect
// Each returns the process's exit status and throws std::invalid_argument on bad input.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mod::grid {

struct GridOptions {
  std::string spec;  // grid spec file (text GridSpec)
  std::string out;   // output directory; empty: the spec's out_dir, else runs/grids/<name>
  std::string data;  // token shard directory for every point; empty: the spec's base.data.dir
};

// Time estimates come from at most one of: a token rate, a FLOP rate, or measuring here.
struct PlanOptions {
  GridOptions grid;
  std::optional<double> tokens_per_second;
  std::optional<double> flops_per_second;
  bool measure = false;
  int measure_steps = 3;  // timed steps per shape and variant, after one warm-up step
  // Warn about points whose predicted peak memory per rank exceeds this (GB, 1e9 bytes).
  std::optional<double> device_memory_gb;
};
// Prints the points with their estimated times; writes OUT/plan.csv and the point configs.
int plan(const PlanOptions& o);

struct RunOptions {
  GridOptions grid;
  std::vector<std::string> points;  // only these points; empty: all runnable ones
  std::string mpirun = "mpirun";    // launcher for base.parallel.dp x tp > 1
};
// Trains the points here, one after another, as `modtrain train` children of this program
// (grid/local_runner.h): finished ones are skipped, partial ones resumed. Returns 75 when
// stopped by a signal, 1 when a point failed.
int run(const RunOptions& o);

struct SubmitOptions {
  GridOptions grid;
  bool dry_run = false;  // write the scripts without running sbatch
};
// Writes OUT/grid.sbatch and OUT/modtrain_job.sh (grid/sbatch.h) and submits the array.
int submit(const SubmitOptions& o);

struct CollectOptions {
  GridOptions grid;
  int eval_batches = 0;  // for points without a final val_loss; 0: the point's train.eval_batches
};
// Final validation losses -> OUT/results.csv and the plots.
int collect(const CollectOptions& o);

}  // namespace mod::grid
