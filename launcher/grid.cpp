// modtrain grid plan|run|submit|collect: isoFLOP grids (configs/grid.proto, docs/grids.md).
// Parses each subcommand's options and calls its function in grid/commands.h.
#include "grid/commands.h"

#include <cstdio>
#include <string>
#include <vector>

#include "launcher/cli.h"

namespace mod::cli {

namespace {

constexpr const char* kGridUsage =
    "usage: modtrain grid <subcommand> --spec FILE [options]\n"
    "\n"
    "subcommands:\n"
    "  plan     the points of the grid: parameters, FLOPs/token, tokens, steps, estimated time,\n"
    "           predicted peak memory per rank;\n"
    "           writes OUT/plan.csv and OUT/points/<point>.textproto\n"
    "  run      trains the points here, one after another; skips finished ones, resumes partial ones\n"
    "  submit   writes OUT/grid.sbatch (a Slurm job array, one task per point) and runs sbatch on it\n"
    "  collect  final validation losses -> OUT/results.csv, OUT/isoflop.png,\n"
    "           OUT/loss_vs_flops_per_token.png\n"
    "\n"
    "`modtrain grid <subcommand> --help` lists its options; docs/grids.md has examples.\n";

void add_grid_options(po::options_description& o) {
  o.add_options()
      ("spec", po::value<std::string>()->required(), "grid spec (text GridSpec), e.g. configs/grids/cpu_small.textproto")
      ("out", po::value<std::string>(), "output directory (overrides the spec's out_dir), e.g. runs/grids/cpu_small")
      ("data", po::value<std::string>(), "token shard directory for every point (overrides base.data.dir)");
}

grid::GridOptions grid_options(const po::variables_map& vm) {
  grid::GridOptions g;
  g.spec = vm["spec"].as<std::string>();
  if (vm.count("out")) g.out = vm["out"].as<std::string>();
  if (vm.count("data")) g.data = vm["data"].as<std::string>();
  return g;
}

int plan(int argc, char** argv) {
  po::options_description o("modtrain grid plan options");
  add_grid_options(o);
  o.add_options()
      ("tokens-per-second", po::value<double>(), "estimate times from this training throughput, e.g. 20000")
      ("flops-per-second", po::value<double>(), "estimate times from this training FLOP rate, e.g. 4e14 (an H100 at 40% MFU)")
      ("measure", po::bool_switch(), "time a few training steps of every shape and variant on this machine")
      ("measure-steps", po::value<int>()->default_value(3), "timed steps per shape and variant (after one warm-up step)")
      ("device-memory-gb", po::value<double>(), "warn about points whose predicted peak memory per rank exceeds this, e.g. 80");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid plan --spec FILE [--tokens-per-second X | --flops-per-second X | --measure]",
             o, vm))
    return 0;
  grid::PlanOptions p;
  p.grid = grid_options(vm);
  if (vm.count("tokens-per-second")) p.tokens_per_second = vm["tokens-per-second"].as<double>();
  if (vm.count("flops-per-second")) p.flops_per_second = vm["flops-per-second"].as<double>();
  p.measure = vm["measure"].as<bool>();
  p.measure_steps = vm["measure-steps"].as<int>();
  if (vm.count("device-memory-gb")) p.device_memory_gb = vm["device-memory-gb"].as<double>();
  return grid::plan(p);
}

int run(int argc, char** argv) {
  po::options_description o("modtrain grid run options");
  add_grid_options(o);
  o.add_options()
      ("point", po::value<std::vector<std::string>>()->composing(), "run only this point (repeatable), e.g. b1e13_s2_mod")
      ("mpirun", po::value<std::string>()->default_value("mpirun"),
       "launcher for points with base.parallel.dp x tp > 1 (run as MPIRUN -np N modtrain train ...)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid run --spec FILE [--point NAME ...]", o, vm)) return 0;
  grid::RunOptions r;
  r.grid = grid_options(vm);
  if (vm.count("point")) r.points = vm["point"].as<std::vector<std::string>>();
  r.mpirun = vm["mpirun"].as<std::string>();
  return grid::run(r);
}

int submit(int argc, char** argv) {
  po::options_description o("modtrain grid submit options");
  add_grid_options(o);
  o.add_options()("dry-run", po::bool_switch(), "write OUT/grid.sbatch (with OUT/modtrain_job.sh and the point configs) without submitting");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid submit --spec FILE [--dry-run]", o, vm)) return 0;
  return grid::submit({grid_options(vm), vm["dry-run"].as<bool>()});
}

int collect(int argc, char** argv) {
  po::options_description o("modtrain grid collect options");
  add_grid_options(o);
  o.add_options()("eval-batches", po::value<int>()->default_value(0),
                  "validation batches when a point's loss must be evaluated (no val_loss at its final "
                  "step); 0: the point's train.eval_batches");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid collect --spec FILE", o, vm)) return 0;
  return grid::collect({grid_options(vm), vm["eval-batches"].as<int>()});
}

}  // namespace

int grid(int argc, char** argv) {
  const std::string sub = argc >= 2 ? argv[1] : "";
  if (sub == "plan") return plan(argc - 1, argv + 1);
  if (sub == "run") return run(argc - 1, argv + 1);
  if (sub == "submit") return submit(argc - 1, argv + 1);
  if (sub == "collect") return collect(argc - 1, argv + 1);
  if (sub == "--help" || sub == "-h") {
    std::fputs(kGridUsage, stdout);
    return 0;
  }
  std::fprintf(stderr, "%s%s", sub.empty() ? "" : ("modtrain grid: unknown subcommand '" + sub + "'\n\n").c_str(),
               kGridUsage);
  return 2;
}

}  // namespace mod::cli
