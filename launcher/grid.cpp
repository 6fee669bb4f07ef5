// modtrain grid plan|run|submit|collect: isoFLOP grids (configs/grid.proto, docs/grids.md).
// Every subcommand expands the spec afresh (grid/expand.h), so point names, step counts
// and Slurm array indices are the same for plan, run, submit and collect of one spec. Layout
// under the output directory OUT:
//   OUT/plan.csv, OUT/points/<point>.textproto   one RunConfig per runnable point (plan, run, submit)
//   OUT/runs/<point>/                            each point's run directory (the trainer's)
//   OUT/logs/                                    training logs (run: <point>.log; Slurm: task_<i>.out)
//   OUT/grid.sbatch                              the job-array script (submit)
//   OUT/results.csv, OUT/*.png, OUT/plots/       collect
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "configs/config.h"
#include "grid/expand.h"
#include "grid/plots.h"
#include "grid/results.h"
#include "grid/run_state.h"
#include "grid/sbatch.h"
#include "grid/spec.h"
#include "grid/throughput.h"
#include "launcher/cli.h"
#include "train/checkpoint/export.h"
#include "train/stop_signal.h"

namespace mod::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kGridUsage =
    "usage: modtrain grid <subcommand> --spec FILE [options]\n"
    "\n"
    "subcommands:\n"
    "  plan     the points of the grid: parameters, FLOPs/token, tokens, steps, estimated time;\n"
    "           writes OUT/plan.csv and OUT/points/<point>.textproto\n"
    "  run      trains the points here, one after another; skips finished ones, resumes partial ones\n"
    "  submit   writes OUT/grid.sbatch (a Slurm job array, one task per point) and runs sbatch on it\n"
    "  collect  final validation losses -> OUT/results.csv, OUT/isoflop.png,\n"
    "           OUT/loss_vs_flops_per_token.png\n"
    "\n"
    "`modtrain grid <subcommand> --help` lists its options; docs/grids.md has examples.\n";

struct Grid {
  modtrain::GridSpec spec;
  std::string spec_path;
  std::string out;  // absolute
  std::vector<grid::GridPoint> points;

  std::string point_config(const grid::GridPoint& p) const { return out + "/points/" + p.name + ".textproto"; }
  std::string run_dir(const grid::GridPoint& p) const { return out + "/runs/" + p.name; }
  int runnable() const {
    int n = 0;
    for (const auto& p : points) n += !p.skipped();
    return n;
  }
};

void add_grid_options(po::options_description& o) {
  o.add_options()
      ("spec", po::value<std::string>()->required(), "grid spec (text GridSpec), e.g. configs/grids/cpu_small.textproto")
      ("out", po::value<std::string>(), "output directory (overrides the spec's out_dir), e.g. runs/grids/cpu_small")
      ("data", po::value<std::string>(), "token shard directory for every point (overrides base.data.dir)");
}

Grid load(const po::variables_map& vm) {
  Grid g;
  g.spec_path = vm["spec"].as<std::string>();
  g.spec = grid::load_grid(g.spec_path);
  if (vm.count("data")) g.spec.mutable_base()->mutable_data()->set_dir(vm["data"].as<std::string>());
  std::string out = vm.count("out") ? vm["out"].as<std::string>() : g.spec.out_dir();
  if (out.empty()) out = "runs/grids/" + g.spec.name();
  g.out = fs::absolute(out).lexically_normal().string();
  while (g.out.size() > 1 && g.out.back() == '/') g.out.pop_back();
  g.points = grid::expand(g.spec);
  return g;
}

std::string si(double v) {  // 1234567 -> "1.23M"; 3e9 -> "3B" (parameters, tokens)
  const char* units[] = {"", "k", "M", "B", "T", "P", "E"};
  int u = 0;
  while (std::abs(v) >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.3g%s", v, units[u]);
  return buf;
}

std::string duration(double s) {  // 75 -> "1m15s"
  char buf[32];
  const long long t = static_cast<long long>(s + 0.5);
  if (t < 60)
    std::snprintf(buf, sizeof buf, "%llds", t);
  else if (t < 3600)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else if (t < 86400)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, t % 3600 / 60);
  else
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", t / 86400, t % 86400 / 3600);
  return buf;
}

// OUT/points/<point>.textproto for every runnable point; a file is rewritten only when it changes.
void write_points(const Grid& g) {
  fs::create_directories(g.out + "/points");
  for (const auto& p : g.points) {
    if (p.skipped()) continue;
    char head[512];
    std::snprintf(head, sizeof head,
                  "# Point %s of isoFLOP grid %s (%s), written by modtrain grid.\n"
                  "# Budget %s FLOPs: %lld steps x %lld tokens x %.4g training FLOPs/token = %.4g FLOPs.\n"
                  "# proto-file: configs/modtrain.proto\n# proto-message: modtrain.RunConfig\n",
                  p.name.c_str(), g.spec.name().c_str(), g.spec_path.c_str(), p.budget_label.c_str(),
                  static_cast<long long>(p.steps), static_cast<long long>(p.tokens_per_step),
                  p.flops.training_per_token, p.flops_spent);
    const std::string text = head + config::to_text(p.config);
    const std::string path = g.point_config(p);
    std::ifstream old(path);
    std::stringstream ss;
    ss << old.rdbuf();
    if (old && ss.str() == text) continue;
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, path);
  }
}

void print_skipped(const Grid& g) {
  bool any = false;
  for (const auto& p : g.points)
    if (p.skipped()) {
      if (!any) std::printf("skipped points:\n");
      any = true;
      std::printf("  %s: %s\n", p.name.c_str(), p.skip_reason.c_str());
    }
}

std::string header_line(const Grid& g) {
  char buf[512];
  const auto& t = g.spec.base().train();
  std::snprintf(buf, sizeof buf,
                "grid %s (%s): %d budgets x %d shapes x %d variants = %zu points, %d runnable; "
                "%lld tokens per step (batch_size %d x grad_accum %d x seq_len %d)\noutput: %s\n",
                g.spec.name().c_str(), g.spec_path.c_str(), g.spec.budgets_size(), g.spec.shapes_size(),
                g.spec.variants_size(), g.points.size(), g.runnable(),
                static_cast<long long>(t.batch_size()) * t.grad_accum() * g.spec.base().model().seq_len(),
                t.batch_size(), t.grad_accum(), g.spec.base().model().seq_len(), g.out.c_str());
  return buf;
}

// ---- plan ----

int plan(int argc, char** argv) {
  po::options_description o("modtrain grid plan options");
  add_grid_options(o);
  o.add_options()
      ("tokens-per-second", po::value<double>(), "estimate times from this training throughput, e.g. 20000")
      ("flops-per-second", po::value<double>(), "estimate times from this training FLOP rate, e.g. 4e14 (an H100 at 40% MFU)")
      ("measure", po::bool_switch(), "time a few training steps of every shape and variant on this machine")
      ("measure-steps", po::value<int>()->default_value(3), "timed steps per shape and variant (after one warm-up step)");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid plan --spec FILE [--tokens-per-second X | --flops-per-second X | --measure]",
             o, vm))
    return 0;
  const int rates = static_cast<int>(vm.count("tokens-per-second") + vm.count("flops-per-second")) +
                    (vm["measure"].as<bool>() ? 1 : 0);
  if (rates > 1)
    throw std::invalid_argument("give at most one of --tokens-per-second, --flops-per-second, --measure");
  for (const char* opt : {"tokens-per-second", "flops-per-second"})
    if (vm.count(opt) && !(vm[opt].as<double>() > 0))
      throw std::invalid_argument(std::string("--") + opt + " must be positive");
  if (vm["measure-steps"].as<int>() < 1) throw std::invalid_argument("--measure-steps must be >= 1");
  Grid g = load(vm);
  std::printf("%s", header_line(g).c_str());

  // Estimated seconds per point, from a measured step time per (shape, variant) or a rate.
  std::map<std::pair<int, int>, grid::Throughput> measured;
  std::string rate_note = "no throughput given: --measure, --tokens-per-second or --flops-per-second";
  if (vm["measure"].as<bool>()) {
    rate_note = "measured here (forward + backward + AdamW on random tokens)";
    for (const auto& p : g.points) {
      const auto key = std::make_pair(p.shape_index, p.variant_index);
      if (p.skipped() || measured.count(key)) continue;
      const auto t = grid::measure_throughput(p.config, vm["measure-steps"].as<int>());
      measured[key] = t;
      std::printf("measured %s %s: %.3g s/step, %s tokens/s, %.3g GFLOP/s\n", p.shape.c_str(),
                  p.variant.c_str(), t.seconds_per_step, si(t.tokens_per_second).c_str(),
                  t.flops_per_second / 1e9);
      std::fflush(stdout);
    }
  } else if (vm.count("tokens-per-second")) {
    rate_note = si(vm["tokens-per-second"].as<double>()) + " tokens/s";
  } else if (vm.count("flops-per-second")) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g FLOP/s", vm["flops-per-second"].as<double>());
    rate_note = buf;
  }
  auto estimate = [&](const grid::GridPoint& p) -> double {  // seconds; < 0: unknown
    if (p.skipped()) return -1;
    if (vm.count("tokens-per-second")) return static_cast<double>(p.tokens()) / vm["tokens-per-second"].as<double>();
    if (vm.count("flops-per-second")) return p.flops_spent / vm["flops-per-second"].as<double>();
    auto it = measured.find({p.shape_index, p.variant_index});
    return it == measured.end() ? -1 : static_cast<double>(p.steps) * it->second.seconds_per_step;
  };

  std::printf("\n%-24s %5s %9s %13s %15s %9s %9s %7s %10s\n", "point", "index", "params",
              "fwd FLOPs/tok", "train FLOPs/tok", "tokens", "steps", "spent", "est. time");
  double total_flops = 0, total_seconds = 0;
  bool all_known = true;
  std::ofstream csv;
  fs::create_directories(g.out);
  const std::string csv_path = g.out + "/plan.csv";
  csv.open(csv_path + ".tmp");
  csv << "point,array_index,budget,shape,variant,routed,parameters,non_embedding_parameters,"
         "forward_flops_per_token,training_flops_per_token,tokens_per_step,steps,tokens,flops,"
         "budget_used,est_seconds,status,reason\n";
  for (const auto& p : g.points) {
    const double est = estimate(p);
    char line[512];
    std::snprintf(line, sizeof line, "%s,%d,%s,%s,%s,%d,%lld,%lld,%.6g,%.6g,%lld,%lld,%lld,%.6g,%.6f,",
                  p.name.c_str(), p.array_index, p.budget_label.c_str(), p.shape.c_str(), p.variant.c_str(),
                  p.routed ? 1 : 0, static_cast<long long>(p.flops.parameters),
                  static_cast<long long>(p.flops.non_embedding_parameters), p.flops.forward_per_token,
                  p.flops.training_per_token, static_cast<long long>(p.tokens_per_step),
                  static_cast<long long>(p.steps), static_cast<long long>(p.tokens()), p.flops_spent,
                  p.flops_spent / p.budget);
    csv << line;
    if (est >= 0) csv << est;
    csv << "," << (p.skipped() ? "skipped" : "runnable") << "," << grid::csv_field(p.skip_reason) << "\n";
    if (p.skipped()) continue;
    total_flops += p.flops_spent;
    if (est >= 0)
      total_seconds += est;
    else
      all_known = false;
    std::printf("%-24s %5d %9s %13.3g %15.3g %9s %9lld %6.2f%% %10s\n", p.name.c_str(), p.array_index,
                si(static_cast<double>(p.flops.parameters)).c_str(), p.flops.forward_per_token,
                p.flops.training_per_token, si(static_cast<double>(p.tokens())).c_str(),
                static_cast<long long>(p.steps), 100 * p.flops_spent / p.budget,
                est >= 0 ? duration(est).c_str() : "-");
  }
  csv.close();
  fs::rename(csv_path + ".tmp", csv_path);
  std::printf("\n");
  print_skipped(g);
  std::printf("total: %.3g training FLOPs in %d runs", total_flops, g.runnable());
  if (all_known && g.runnable() > 0) std::printf(", about %s one after another", duration(total_seconds).c_str());
  std::printf(" (time: %s)\n", rate_note.c_str());
  write_points(g);
  std::printf("wrote %s and %d point configs in %s/points/\n", csv_path.c_str(), g.runnable(), g.out.c_str());
  return 0;
}

// ---- run ----

std::atomic<pid_t> g_child{0};
volatile std::sig_atomic_t g_signal = 0;

// SIGINT, SIGTERM, SIGUSR1: the running point checkpoints and exits 75, then run stops. The
// child always gets SIGUSR1: the trainer treats it as SIGTERM, and mpirun passes it on to every
// rank (on SIGTERM mpirun would end the ranks itself).
void forward_signal(int sig) {
  g_signal = sig;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, SIGUSR1);
}

// Runs argv with stdout and stderr appended to log; returns its exit status (128 + signal when
// killed). The child gets its own process group, so a terminal's Ctrl-C reaches only this
// process, which turns it into a graceful stop; the child gets SIGTERM if this process dies.
int spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "modtrain grid run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  if (g_signal) ::kill(pid, SIGUSR1);  // arrived during fork
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  g_child = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_lines(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) out += "    " + l + "\n";
  return out;
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
  Grid g = load(vm);
  std::set<std::string> only;
  if (vm.count("point"))
    for (const auto& n : vm["point"].as<std::vector<std::string>>()) {
      bool known = false;
      for (const auto& p : g.points) known = known || (p.name == n && !p.skipped());
      if (!known) throw std::invalid_argument("--point " + n + ": not a runnable point of grid " + g.spec.name());
      only.insert(n);
    }
  std::printf("%s", header_line(g).c_str());
  print_skipped(g);
  write_points(g);
  fs::create_directories(g.out + "/logs");
  fs::create_directories(g.out + "/runs");

  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const int ranks = g.spec.base().parallel().dp() * g.spec.base().parallel().tp();
  std::vector<std::string> prefix;
  if (ranks > 1) {
    const std::string mpirun = grid::find_on_path(vm["mpirun"].as<std::string>());
    if (mpirun.empty())
      throw std::runtime_error("base.parallel.dp x tp = " + std::to_string(ranks) + " needs --mpirun '" +
                               vm["mpirun"].as<std::string>() + "', which is not on PATH");
    prefix = {mpirun, "-np", std::to_string(ranks)};
  }
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);

  std::vector<const grid::GridPoint*> todo;
  for (const auto& p : g.points)
    if (!p.skipped() && (only.empty() || only.count(p.name))) todo.push_back(&p);
  int finished_before = 0, trained = 0, failed = 0;
  bool stopped = false;
  const auto t_start = Clock::now();
  for (size_t i = 0; i < todo.size() && !stopped; ++i) {
    const grid::GridPoint& p = *todo[i];
    const std::string run_dir = g.run_dir(p), log = g.out + "/logs/" + p.name + ".log";
    const grid::RunState before = grid::inspect_run(run_dir, p.steps, p.tokens_per_step);
    if (before.status != grid::RunStatus::Finished && g_signal) {
      stopped = true;
      break;
    }
    std::printf("[%zu/%zu] %s: ", i + 1, todo.size(), p.name.c_str());
    if (before.status == grid::RunStatus::Finished) {
      std::printf("finished already, skipped\n");
      ++finished_before;
      continue;
    }
    if (before.checkpoint_step == p.steps) {  // stopped between its final checkpoint and the weights
      try {
        ckpt::export_safetensors(run_dir, run_dir + "/model.safetensors");
        std::printf("final checkpoint without model.safetensors: exported it\n");
        ++trained;
      } catch (const std::exception& e) {
        std::printf("FAILED: cannot export its final checkpoint: %s\n", e.what());
        ++failed;
      }
      continue;
    }
    std::printf("%lld steps, %.3g FLOPs%s ... ", static_cast<long long>(p.steps), p.flops_spent,
                before.checkpoint_step > 0
                    ? (", resuming after step " + std::to_string(before.checkpoint_step)).c_str()
                    : "");
    std::fflush(stdout);
    std::vector<std::string> args = prefix;
    args.insert(args.end(), {self, "train", "--config", g.point_config(p), "--run-dir", run_dir,
                             "--resume", "auto"});
    const auto t0 = Clock::now();
    const int rc = spawn(args, log);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const grid::RunState after = grid::inspect_run(run_dir, p.steps, p.tokens_per_step);
    if (rc == 0 && after.status == grid::RunStatus::Finished) {
      ++trained;
      std::printf("done in %s", duration(secs).c_str());
      if (after.final_val_loss) std::printf(", val loss %.4f", *after.final_val_loss);
      std::printf("\n");
    } else if (rc == train::kExitCheckpointedStop || g_signal) {
      std::printf("stopped after %s (%s); `modtrain grid run` again resumes it\n", duration(secs).c_str(),
                  after.describe().c_str());
      stopped = true;
    } else {
      ++failed;
      std::printf("FAILED (exit %d) after %s; log %s ends:\n%s", rc, duration(secs).c_str(), log.c_str(),
                  last_lines(log, 5).c_str());
    }
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf("grid run: %d trained now, %d finished before, %d failed, %zu to go, in %s; logs in %s/logs/\n",
              trained, finished_before, failed, todo.size() - trained - finished_before - failed,
              duration(total).c_str(), g.out.c_str());
  if (stopped) {
    std::printf("stopped%s: `modtrain grid run --spec %s` continues where it stopped\n",
                g_signal ? (" by signal " + std::to_string(g_signal)).c_str() : "", g.spec_path.c_str());
    return train::kExitCheckpointedStop;
  }
  return failed > 0 ? 1 : 0;
}

// ---- submit ----

int submit(int argc, char** argv) {
  po::options_description o("modtrain grid submit options");
  add_grid_options(o);
  o.add_options()("dry-run", po::bool_switch(), "write OUT/grid.sbatch (and the point configs) without submitting");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid submit --spec FILE [--dry-run]", o, vm)) return 0;
  Grid g = load(vm);
  std::printf("%s", header_line(g).c_str());
  print_skipped(g);
  std::vector<const grid::GridPoint*> runnable;
  int finished = 0;
  for (const auto& p : g.points) {
    if (p.skipped()) continue;
    runnable.push_back(&p);
    finished += grid::inspect_run(g.run_dir(p), p.steps, p.tokens_per_step).status == grid::RunStatus::Finished;
  }
  write_points(g);
  fs::create_directories(g.out + "/logs");
  fs::create_directories(g.out + "/runs");
  grid::SbatchPaths paths;
  paths.out_dir = g.out;
  paths.work_dir = fs::current_path().string();
  paths.modtrain = g.spec.slurm().modtrain().empty() ? fs::read_symlink("/proc/self/exe").string()
                                                     : g.spec.slurm().modtrain();
  paths.spec = g.spec_path;
  const std::string script = grid::sbatch_script(g.spec, runnable, paths);
  const std::string path = g.out + "/grid.sbatch";
  std::ofstream(path + ".tmp") << script;
  fs::rename(path + ".tmp", path);
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  std::printf("wrote %s: array %s (%zu points, %d finished already; finished tasks exit at once)\n",
              path.c_str(), grid::array_range(static_cast<int>(runnable.size()), g.spec.slurm().max_concurrent()).c_str(),
              runnable.size(), finished);
  if (vm["dry-run"].as<bool>()) {
    std::printf("dry run: submit it with `sbatch %s`\n", path.c_str());
    return 0;
  }
  const std::string sbatch = grid::find_on_path("sbatch");
  if (sbatch.empty())
    throw std::runtime_error("sbatch is not on PATH (is this a Slurm login node?); the script is written: "
                             "submit " + path + " where Slurm runs, or use --dry-run");
  std::fflush(stdout);
  fs::remove(g.out + "/logs/submit.log");
  const int rc = spawn({sbatch, path}, g.out + "/logs/submit.log");
  std::printf("%s", last_lines(g.out + "/logs/submit.log", 3).c_str());
  if (rc != 0) throw std::runtime_error("sbatch " + path + " failed with exit " + std::to_string(rc) +
                                        " (output in " + g.out + "/logs/submit.log)");
  return 0;
}

// ---- collect ----

int collect(int argc, char** argv) {
  po::options_description o("modtrain grid collect options");
  add_grid_options(o);
  o.add_options()("eval-batches", po::value<int>()->default_value(0),
                  "validation batches when a point's loss must be evaluated (no val_loss at its final "
                  "step); 0: the point's train.eval_batches");
  po::variables_map vm;
  if (!parse(argc, argv, "usage: modtrain grid collect --spec FILE", o, vm)) return 0;
  Grid g = load(vm);
  std::printf("%s", header_line(g).c_str());
  const auto results = grid::collect_results(g.points, g.out + "/runs", vm["eval-batches"].as<int>());
  fs::create_directories(g.out);
  grid::write_results_csv(g.out + "/results.csv", results);

  std::printf("\n%-24s %9s %13s %9s %10s  %s\n", "point", "params", "fwd FLOPs/tok", "steps", "val loss", "status");
  std::vector<const grid::PointResult*> open;
  for (const auto& r : results) {
    const grid::GridPoint& p = *r.point;
    char loss[32] = "-";
    if (r.val_loss) std::snprintf(loss, sizeof loss, "%.4f", *r.val_loss);
    std::printf("%-24s %9s %13.3g %9lld %10s  %s\n", p.name.c_str(), si(static_cast<double>(p.flops.parameters)).c_str(),
                p.flops.forward_per_token, static_cast<long long>(p.steps), loss, r.status.c_str());
    if (r.status != "finished") open.push_back(&r);
  }
  // Per (budget, variant): the isoFLOP-optimal shape.
  std::map<std::pair<int, int>, const grid::PointResult*> best;
  for (const auto& r : results) {
    if (!r.val_loss) continue;
    auto& b = best[{r.point->budget_index, r.point->variant_index}];
    if (!b || *r.val_loss < *b->val_loss) b = &r;
  }
  if (!best.empty()) std::printf("\nlowest loss per budget and variant:\n");
  for (const auto& [key, r] : best)
    std::printf("  %s FLOPs, %-8s %s (%s parameters): %.4f\n", r->point->budget_label.c_str(),
                r->point->variant.c_str(), r->point->shape.c_str(),
                si(static_cast<double>(r->point->flops.parameters)).c_str(), *r->val_loss);
  if (!open.empty()) {
    std::printf("\n%zu of %zu points have no final loss:\n", open.size(), results.size());
    for (const auto* r : open) std::printf("  %s: %s: %s\n", r->point->name.c_str(), r->status.c_str(), r->note.c_str());
  }
  std::printf("\nwrote %s/results.csv\n", g.out.c_str());
  const grid::PlotReport plots = grid::draw_plots(g.spec, results, g.out);
  for (const auto& p : plots.drawn) std::printf("wrote %s\n", p.c_str());
  for (const auto& p : plots.not_drawn) std::printf("not drawn: %s\n", p.c_str());
  return 0;
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
