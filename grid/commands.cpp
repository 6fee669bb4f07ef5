// The `modtrain grid` commands (see commands.h).
#include "grid/commands.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "configs/config.h"
#include "core/util/atomic_file.h"
#include "core/util/find_on_path.h"
#include "grid/expand.h"
#include "grid/local_runner.h"
#include "grid/plots.h"
#include "grid/results.h"
#include "grid/run_state.h"
#include "grid/sbatch.h"
#include "grid/spec.h"
#include "grid/throughput.h"
#include "parallel/pipeline_memory.h"
#include "train/data/dataset.h"
#include "train/checkpoint/export.h"
#include "train/stop_signal.h"

namespace mod::grid {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Grid {
  modtrain::GridSpec spec;
  std::string spec_path;
  std::string out;  // absolute
  std::vector<GridPoint> points;

  std::string point_config(const GridPoint& p) const {
    return out + "/points/" + p.name + ".textproto";
  }
  std::string run_dir(const GridPoint& p) const { return out + "/runs/" + p.name; }
  int runnable() const {
    int n = 0;
    for (const auto& p : points) n += !p.skipped();
    return n;
  }
};

Grid load(const GridOptions& o) {
  Grid g;
  g.spec_path = o.spec;
  g.spec = load_grid(g.spec_path);
  if (!o.data.empty()) g.spec.mutable_base()->mutable_data()->set_dir(o.data);
  std::string out = !o.out.empty() ? o.out : g.spec.out_dir();
  if (out.empty()) out = "runs/grids/" + g.spec.name();
  g.out = fs::absolute(out).lexically_normal().string();
  while (g.out.size() > 1 && g.out.back() == '/') g.out.pop_back();
  g.points = expand(g.spec);
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
    std::snprintf(
        head, sizeof head,
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
    util::replace_file(path, text);
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
  std::snprintf(
      buf, sizeof buf,
      "grid %s (%s): %d budgets x %d shapes x %d variants = %zu points, %d runnable; "
      "%lld tokens per step (batch_size %d x grad_accum %d x seq_len %d)\noutput: %s\n",
      g.spec.name().c_str(), g.spec_path.c_str(), g.spec.budgets_size(), g.spec.shapes_size(),
      g.spec.variants_size(), g.points.size(), g.runnable(),
      static_cast<long long>(t.batch_size()) * t.grad_accum() * g.spec.base().model().seq_len(),
      t.batch_size(), t.grad_accum(), g.spec.base().model().seq_len(), g.out.c_str());
  return buf;
}

// Training tokens of the corpus the points read (base.data.dir, or --data), from its manifest;
// none when it is not prepared yet. A point that trains on more tokens rereads its data.
std::optional<int64_t> corpus_tokens(const Grid& g) {
  const std::string manifest = g.spec.base().data().dir() + "/" + data::kManifestName;
  if (!fs::exists(manifest)) return std::nullopt;
  const auto m = data::read_manifest(manifest);
  int64_t tokens = 0;
  for (const auto& s : m.train()) tokens += static_cast<int64_t>(s.tokens());
  return tokens;
}

}  // namespace

// ---- plan ----

int plan(const PlanOptions& o) {
  const int rates = o.tokens_per_second.has_value() + o.flops_per_second.has_value() + o.measure;
  if (rates > 1)
    throw std::invalid_argument(
        "give at most one of --tokens-per-second, --flops-per-second, --measure");
  if (o.tokens_per_second && !(*o.tokens_per_second > 0))
    throw std::invalid_argument("--tokens-per-second must be positive");
  if (o.flops_per_second && !(*o.flops_per_second > 0))
    throw std::invalid_argument("--flops-per-second must be positive");
  if (o.measure_steps < 1) throw std::invalid_argument("--measure-steps must be >= 1");
  Grid g = load(o.grid);
  std::printf("%s", header_line(g).c_str());

  // Estimated seconds per point, from a measured step time per (shape, variant) or a rate.
  std::map<std::pair<int, int>, Throughput> measured;
  std::string rate_note =
      "no throughput given: --measure, --tokens-per-second or --flops-per-second";
  if (o.measure) {
    rate_note = "measured here (forward + backward + AdamW on random tokens)";
    for (const auto& p : g.points) {
      const auto key = std::make_pair(p.shape_index, p.variant_index);
      if (p.skipped() || measured.count(key)) continue;
      const auto t = measure_throughput(p.config, o.measure_steps);
      measured[key] = t;
      std::printf("measured %s %s: %.3g s/step, %s tokens/s, %.3g GFLOP/s\n", p.shape.c_str(),
                  p.variant.c_str(), t.seconds_per_step, si(t.tokens_per_second).c_str(),
                  t.flops_per_second / 1e9);
      std::fflush(stdout);
    }
  } else if (o.tokens_per_second) {
    rate_note = si(*o.tokens_per_second) + " tokens/s";
  } else if (o.flops_per_second) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3g FLOP/s", *o.flops_per_second);
    rate_note = buf;
  }
  auto estimate = [&](const GridPoint& p) -> double {  // seconds; < 0: unknown
    if (p.skipped()) return -1;
    if (o.tokens_per_second) return static_cast<double>(p.tokens()) / *o.tokens_per_second;
    if (o.flops_per_second) return p.flops_spent / *o.flops_per_second;
    auto it = measured.find({p.shape_index, p.variant_index});
    return it == measured.end() ? -1 : static_cast<double>(p.steps) * it->second.seconds_per_step;
  };

  std::printf("\n%-24s %5s %9s %13s %15s %9s %9s %7s %10s %11s\n", "point", "index", "params",
              "fwd FLOPs/tok", "train FLOPs/tok", "tokens", "steps", "spent", "est. time",
              "peak mem");
  std::vector<std::string> too_big;  // points whose predicted peak exceeds --device-memory-gb
  std::vector<std::string> rereads;  // points that train on more tokens than the corpus holds
  const std::optional<int64_t> data_tokens = corpus_tokens(g);
  double total_flops = 0, total_seconds = 0;
  bool all_known = true;
  std::ostringstream csv;
  fs::create_directories(g.out);
  const std::string csv_path = g.out + "/plan.csv";
  csv << "point,array_index,budget,shape,variant,routed,parameters,non_embedding_parameters,"
         "forward_flops_per_token,training_flops_per_token,tokens_per_step,steps,tokens,flops,"
         "budget_used,est_seconds,predicted_peak_bytes,data_epochs,status,reason\n";
  for (const auto& p : g.points) {
    const double est = estimate(p);
    // Per rank, for the point's own layout (the fullest pipeline rank's under pp).
    const double peak = p.skipped() ? -1 : parallel::predicted_peak(p.config);
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s,%d,%s,%s,%s,%d,%lld,%lld,%.6g,%.6g,%lld,%lld,%lld,%.6g,%.6f,", p.name.c_str(),
                  p.array_index, p.budget_label.c_str(), p.shape.c_str(), p.variant.c_str(),
                  p.routed ? 1 : 0, static_cast<long long>(p.flops.parameters),
                  static_cast<long long>(p.flops.non_embedding_parameters),
                  p.flops.forward_per_token, p.flops.training_per_token,
                  static_cast<long long>(p.tokens_per_step), static_cast<long long>(p.steps),
                  static_cast<long long>(p.tokens()), p.flops_spent, p.flops_spent / p.budget);
    csv << line;
    if (est >= 0) csv << est;
    csv << ",";
    if (peak >= 0) csv << static_cast<long long>(peak);
    // Passes over the training split (> 1: the point sees some tokens twice); empty: unknown.
    const double epochs = data_tokens && *data_tokens > 0 && !p.skipped()
                              ? static_cast<double>(p.tokens()) / static_cast<double>(*data_tokens)
                              : -1;
    csv << ",";
    if (epochs >= 0) csv << epochs;
    csv << "," << (p.skipped() ? "skipped" : "runnable") << "," << csv_field(p.skip_reason) << "\n";
    if (p.skipped()) continue;
    total_flops += p.flops_spent;
    if (est >= 0)
      total_seconds += est;
    else
      all_known = false;
    const bool fits = !o.device_memory_gb || peak <= *o.device_memory_gb * 1e9;
    if (!fits) too_big.push_back(p.name);
    char reread[48] = "";
    if (epochs > 1) {
      std::snprintf(reread, sizeof reread, " rereads %.2fx", epochs);
      rereads.push_back(p.name + reread);
    }
    std::printf("%-24s %5d %9s %13.3g %15.3g %9s %9lld %6.2f%% %10s %9.1fGB%s%s\n", p.name.c_str(),
                p.array_index, si(static_cast<double>(p.flops.parameters)).c_str(),
                p.flops.forward_per_token, p.flops.training_per_token,
                si(static_cast<double>(p.tokens())).c_str(), static_cast<long long>(p.steps),
                100 * p.flops_spent / p.budget, est >= 0 ? duration(est).c_str() : "-",
                peak / 1e9, fits ? "" : " !", reread);
  }
  util::replace_file(csv_path, csv.str());
  std::printf("\n");
  if (!too_big.empty()) {
    std::printf("warning: %zu points' predicted peak exceeds %.4g GB per device (marked !): ",
                too_big.size(), *o.device_memory_gb);
    for (size_t i = 0; i < too_big.size(); ++i)
      std::printf("%s%s", i ? ", " : "", too_big[i].c_str());
    std::printf("\n(modtrain memory --config OUT/points/<point>.textproto shows where it goes; "
                "more tp, ZeRO-1 or recomputation lowers it)\n");
  }
  if (data_tokens && !rereads.empty()) {
    std::printf("warning: %zu points train on more tokens than the %s training tokens of %s, so "
                "they reread data: ",
                rereads.size(), si(static_cast<double>(*data_tokens)).c_str(),
                g.spec.base().data().dir().c_str());
    for (size_t i = 0; i < rereads.size(); ++i)
      std::printf("%s%s", i ? ", " : "", rereads[i].c_str());
    std::printf("\n");
  } else if (!data_tokens) {
    std::printf("data %s is not prepared: whether points reread it is not checked\n",
                g.spec.base().data().dir().c_str());
  }
  print_skipped(g);
  std::printf("total: %.3g training FLOPs in %d runs", total_flops, g.runnable());
  if (all_known && g.runnable() > 0)
    std::printf(", about %s one after another", duration(total_seconds).c_str());
  std::printf(" (time: %s)\n", rate_note.c_str());
  write_points(g);
  std::printf("wrote %s and %d point configs in %s/points/\n", csv_path.c_str(), g.runnable(),
              g.out.c_str());
  return 0;
}

// ---- run ----

int run(const RunOptions& o) {
  Grid g = load(o.grid);
  std::set<std::string> only;
  for (const auto& n : o.points) {
    bool known = false;
    for (const auto& p : g.points) known = known || (p.name == n && !p.skipped());
    if (!known)
      throw std::invalid_argument("--point " + n + ": not a runnable point of grid " +
                                  g.spec.name());
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
    const std::string mpirun = util::find_on_path(o.mpirun);
    if (mpirun.empty())
      throw std::runtime_error("base.parallel.dp x tp = " + std::to_string(ranks) +
                               " needs --mpirun '" + o.mpirun + "', which is not on PATH");
    prefix = {mpirun, "-np", std::to_string(ranks)};
  }
  forward_stop_signals();

  std::vector<const GridPoint*> todo;
  for (const auto& p : g.points)
    if (!p.skipped() && (only.empty() || only.count(p.name))) todo.push_back(&p);
  int finished_before = 0, trained = 0, failed = 0;
  bool stopped = false;
  const auto t_start = Clock::now();
  for (size_t i = 0; i < todo.size() && !stopped; ++i) {
    const GridPoint& p = *todo[i];
    const std::string run_dir = g.run_dir(p), log = g.out + "/logs/" + p.name + ".log";
    const RunState before = inspect_run(run_dir, p.steps, p.tokens_per_step);
    if (before.status != RunStatus::Finished && stop_signal()) {
      stopped = true;
      break;
    }
    std::printf("[%zu/%zu] %s: ", i + 1, todo.size(), p.name.c_str());
    if (before.status == RunStatus::Finished) {
      std::printf("finished already, skipped\n");
      ++finished_before;
      continue;
    }
    if (before.checkpoint_step ==
        p.steps) {  // stopped between its final checkpoint and the weights
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
    const int rc = run_logged(args, log);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const RunState after = inspect_run(run_dir, p.steps, p.tokens_per_step);
    if (rc == 0 && after.status == RunStatus::Finished) {
      ++trained;
      std::printf("done in %s", duration(secs).c_str());
      if (after.final_val_loss) std::printf(", val loss %.4f", *after.final_val_loss);
      std::printf("\n");
    } else if (rc == train::kExitCheckpointedStop || stop_signal()) {
      std::printf("stopped after %s (%s); `modtrain grid run` again resumes it\n",
                  duration(secs).c_str(), after.describe().c_str());
      stopped = true;
    } else {
      ++failed;
      std::printf("FAILED (exit %d) after %s; log %s ends:\n%s", rc, duration(secs).c_str(),
                  log.c_str(), last_lines(log, 5).c_str());
    }
    std::fflush(stdout);
  }
  const double total = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf(
      "grid run: %d trained now, %d finished before, %d failed, %zu to go, in %s; logs in "
      "%s/logs/\n",
      trained, finished_before, failed, todo.size() - trained - finished_before - failed,
      duration(total).c_str(), g.out.c_str());
  if (stopped) {
    std::printf("stopped%s: `modtrain grid run --spec %s` continues where it stopped\n",
                stop_signal() ? (" by signal " + std::to_string(stop_signal())).c_str() : "",
                g.spec_path.c_str());
    return train::kExitCheckpointedStop;
  }
  return failed > 0 ? 1 : 0;
}

// ---- submit ----

int submit(const SubmitOptions& o) {
  Grid g = load(o.grid);
  std::printf("%s", header_line(g).c_str());
  print_skipped(g);
  std::vector<const GridPoint*> runnable;
  int finished = 0;
  for (const auto& p : g.points) {
    if (p.skipped()) continue;
    runnable.push_back(&p);
    finished += inspect_run(g.run_dir(p), p.steps, p.tokens_per_step).status == RunStatus::Finished;
  }
  write_points(g);
  fs::create_directories(g.out + "/logs");
  fs::create_directories(g.out + "/runs");
  SbatchPaths paths;
  paths.out_dir = g.out;
  paths.work_dir = fs::current_path().string();
  paths.modtrain = g.spec.slurm().modtrain().empty() ? fs::read_symlink("/proc/self/exe").string()
                                                     : g.spec.slurm().modtrain();
  paths.spec = g.spec_path;
  const std::string script = sbatch_script(g.spec, runnable, paths);
  const std::string job_sh = g.out + "/" + kJobProtocolFile;  // sourced by grid.sbatch
  util::replace_file(job_sh, job_protocol_script());
  const std::string path = g.out + "/grid.sbatch";
  util::replace_file(path, script);
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  std::printf(
      "wrote %s: array %s (%zu points, %d finished already; finished tasks exit at once)\n",
      path.c_str(),
      array_range(static_cast<int>(runnable.size()), g.spec.slurm().max_concurrent()).c_str(),
      runnable.size(), finished);
  if (o.dry_run) {
    std::printf("dry run: submit it with `sbatch %s`\n", path.c_str());
    return 0;
  }
  const std::string sbatch = util::find_on_path("sbatch");
  if (sbatch.empty())
    throw std::runtime_error(
        "sbatch is not on PATH (is this a Slurm login node?); the script is written: "
        "submit " +
        path + " where Slurm runs, or use --dry-run");
  std::fflush(stdout);
  fs::remove(g.out + "/logs/submit.log");
  const int rc = run_logged({sbatch, path}, g.out + "/logs/submit.log");
  std::printf("%s", last_lines(g.out + "/logs/submit.log", 3).c_str());
  if (rc != 0)
    throw std::runtime_error("sbatch " + path + " failed with exit " + std::to_string(rc) +
                             " (output in " + g.out + "/logs/submit.log)");
  return 0;
}

// ---- collect ----

int collect(const CollectOptions& o) {
  Grid g = load(o.grid);
  std::printf("%s", header_line(g).c_str());
  const auto results = collect_results(g.points, g.out + "/runs", o.eval_batches);
  fs::create_directories(g.out);
  write_results_csv(g.out + "/results.csv", results);

  // MoD losses are labelled by routing: top-C (as trained) sees the whole sequence; causal is
  // what sampling gets.
  std::printf("\n%-24s %9s %13s %9s %10s %10s  %s\n", "point", "params", "fwd FLOPs/tok", "steps",
              "val top-C", "val causal", "status");
  std::vector<const PointResult*> open;
  for (const auto& r : results) {
    const GridPoint& p = *r.point;
    char loss[32] = "-", causal[32] = "-";
    if (r.val_loss) std::snprintf(loss, sizeof loss, "%.4f", *r.val_loss);
    if (r.causal_val_loss) std::snprintf(causal, sizeof causal, "%.4f", *r.causal_val_loss);
    std::printf("%-24s %9s %13.3g %9lld %10s %10s  %s\n", p.name.c_str(),
                si(static_cast<double>(p.flops.parameters)).c_str(), p.flops.forward_per_token,
                static_cast<long long>(p.steps), loss, causal, r.status.c_str());
    if (r.status != "finished") open.push_back(&r);
  }
  // Per (budget, variant): the isoFLOP-optimal shape, by the mean loss over its seeds (top-C;
  // for MoD also by causal routing's mean, which may pick another shape).
  const auto groups = group_by_seed(results);
  auto spread = [](const SeedGroup& sg, bool causal) {
    const auto& v = causal ? sg.causal_losses : sg.losses;
    if (v.size() < 2) return std::string();
    const auto [lo, hi] = std::ranges::minmax(v);
    char buf[96];
    std::snprintf(buf, sizeof buf, " (%zu seeds, %.4f .. %.4f, spread %.4f)", v.size(), lo, hi,
                  hi - lo);
    return std::string(buf);
  };
  bool seeded = false;
  for (const auto& sg : groups) seeded = seeded || sg.results.size() > 1;
  if (seeded) {
    std::printf("\nseed spread (mean over the finished seeds; top-C for MoD):\n");
    for (const auto& sg : groups)
      if (sg.results.size() > 1)
        std::printf("  %s: %.4f%s%s\n", sg.point->name.c_str(), sg.mean(), spread(sg, false).c_str(),
                    sg.losses.size() < sg.results.size()
                        ? (", " + std::to_string(sg.results.size() - sg.losses.size()) +
                           " not finished").c_str()
                        : "");
  }
  std::map<std::pair<int, int>, const SeedGroup*> best, best_causal;
  for (const auto& sg : groups) {
    const auto key = std::make_pair(sg.point->budget_index, sg.point->variant_index);
    auto& b = best[key];
    if (!b || sg.mean() < b->mean()) b = &sg;
    if (!sg.point->routed || !sg.causal_mean()) continue;
    auto& c = best_causal[key];
    if (!c || *sg.causal_mean() < *c->causal_mean()) c = &sg;
  }
  if (!best.empty()) std::printf("\nlowest loss per budget and variant:\n");
  for (const auto& [key, sg] : best) {
    const GridPoint& p = *sg->point;
    std::printf("  %s FLOPs, %-8s %s (%s parameters, %s tokens): %.4f%s%s\n",
                p.budget_label.c_str(), p.variant.c_str(), p.shape.c_str(),
                si(static_cast<double>(p.flops.parameters)).c_str(),
                si(static_cast<double>(p.tokens())).c_str(), sg->mean(),
                p.routed ? " top-C" : "", spread(*sg, false).c_str());
    if (auto it = best_causal.find(key); it != best_causal.end()) {
      const SeedGroup& c = *it->second;
      std::printf("  %s FLOPs, %-8s %s (%s parameters, %s tokens): %.4f causal%s\n",
                  c.point->budget_label.c_str(), c.point->variant.c_str(),
                  c.point->shape.c_str(), si(static_cast<double>(c.point->flops.parameters)).c_str(),
                  si(static_cast<double>(c.point->tokens())).c_str(), *c.causal_mean(),
                  spread(c, true).c_str());
    }
  }
  if (!open.empty()) {
    std::printf("\n%zu of %zu points have no final loss:\n", open.size(), results.size());
    for (const auto* r : open)
      std::printf("  %s: %s: %s\n", r->point->name.c_str(), r->status.c_str(), r->note.c_str());
  }
  std::printf("\nwrote %s/results.csv\n", g.out.c_str());
  const PlotReport plots = draw_plots(g.spec, results, g.out);
  for (const auto& p : plots.drawn) std::printf("wrote %s\n", p.c_str());
  for (const auto& p : plots.not_drawn) std::printf("not drawn: %s\n", p.c_str());
  return 0;
}

}  // namespace mod::grid
