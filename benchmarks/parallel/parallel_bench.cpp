// parallel_bench: what one training step sends between ranks and how long it waits, for each
// dp x tp (+ ep) layout of tiny_dense and tiny_mod, or of any recipe given with --config (the
// MoE and MoDE recipes get the expert-parallel layouts too), next to the minimum the model
// config implies.
//   ./build/benchmarks/parallel_bench                                   (1 rank: dp1)
//   mpirun -n 2 --oversubscribe --bind-to none ./build/benchmarks/parallel_bench  (dp2, tp2,
//                                                                                   dp2+zero1)
//   mpirun -n 2 --oversubscribe --bind-to none ./build/benchmarks/parallel_bench
//       --layouts dp2,dp2+zero2,dp2+zero3,tp2,tp2+sp            (ZeRO stages and sequence parallel)
//   mpirun -n 2 --oversubscribe --bind-to none ./build/benchmarks/parallel_bench
//       --config configs/recipes/tiny_mode_integrated.textproto     (the same and dp2+ep2)
//   mpirun -n 4 --oversubscribe ./build/benchmarks/parallel_bench       (dp2xtp2, dp4, tp4)
//   ./build/benchmarks/parallel_bench --napkin-only --fabric ib-400g --layouts dp64
//       --config configs/recipes/gpt2_small_dense.textproto     (bytes and the predicted step
//       time, no training: parallel_step_time.h)
// As root, add --allow-run-as-root to mpirun. --bind-to none keeps Open MPI from pinning each of
// 2 ranks to one core, which slows the 2-thread 1-rank reference (see set_up_threads). Figures:
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
//             ZeRO-3 (tp 1): (dp - 1) / dp x 4 B x (P + a P + a P_blocks): the reduce-scatter,
//             each micro-batch's forward all-gathers of every unit and backward ones of every
//             block (the outer unit, embedding + final norm + head, stays whole)
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
//   tp group under sequence parallelism: the same, each all-reduce an all-gather + a
//             reduce-scatter, + per routed block 2 x 2 (tp - 1) / tp x a x 4 B x B/dp x C x D
//             (its rows gathered forward and their gradient scattered backward) + once a step
//             2 (tp - 1) / tp x 4 B x P_seq (the sequence-partial gradients: dense blocks' norms,
//             final norm, routers, predictors); MoD's scores, predictor logits and causal loss
//             (4 B x T a sequence each) are left out
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
#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "benchmarks/bench_common.h"
#include "benchmarks/parallel/parallel_bench.h"
#include "benchmarks/parallel/parallel_napkin.h"
#include "benchmarks/parallel/parallel_step_time.h"
#include "configs/config.h"
#include "core/device_report.h"
#include "launcher/cli.h"
#include "parallel/world.h"
#include "train/trainer.h"

using namespace mod;
using namespace mod::bench;
using parallel::world;
namespace po = cli::po;
namespace fs = std::filesystem;

namespace {

// --steps, --warmup, --baseline-threads and --layouts, checked.
Options options_from(const po::variables_map& vm) {
  Options o;
  o.steps = vm["steps"].as<int>();
  o.warmup = vm["warmup"].as<int>();
  o.baseline_threads = vm["baseline-threads"].as<int>();
  if (o.steps < 1 || o.warmup < 1) fail("--steps and --warmup must be >= 1");
  const std::string layouts = vm["layouts"].as<std::string>();
  if (!layouts.empty()) {
    std::stringstream ss(layouts);
    std::string item;
    while (std::getline(ss, item, ',')) o.layouts.push_back(parse_layout(item));
  }
  return o;
}

// --fabric and the options that override its numbers; none of them: no prediction.
std::optional<Fabric> fabric_from(const po::variables_map& vm) {
  struct Override {
    const char* option;
    double Fabric::*field;
    double unit;  // option value x unit = field
  };
  const Override overrides[] = {{"peak-tflops", &Fabric::peak_flops, 1e12},
                                {"mfu", &Fabric::mfu, 1},
                                {"dp-busbw", &Fabric::dp_busbw, 1e9},
                                {"tp-busbw", &Fabric::tp_busbw, 1e9},
                                {"dp-latency-us", &Fabric::dp_latency, 1e-6},
                                {"tp-latency-us", &Fabric::tp_latency, 1e-6}};
  bool any = vm.count("achieved-tflops") > 0;
  for (const Override& o : overrides) any = any || vm.count(o.option);
  if (!vm.count("fabric")) {
    if (any)
      throw std::invalid_argument(
          "the step-time options override a --fabric preset: add --fabric nvlink-h100 or ib-400g");
    return std::nullopt;
  }
  if (!vm.count("napkin-only")) throw std::invalid_argument("--fabric goes with --napkin-only");
  Fabric f = fabric_preset(vm["fabric"].as<std::string>());
  for (const Override& o : overrides)
    if (vm.count(o.option)) {
      const double v = vm[o.option].as<double>();
      const bool latency = std::string(o.option).find("latency") != std::string::npos;
      if (!(latency ? v >= 0 : v > 0) || (o.field == &Fabric::mfu && v > 1))
        throw std::invalid_argument("--" + std::string(o.option) + fmt(" %g: expected ", v) +
                                    (o.field == &Fabric::mfu ? "(0, 1]"
                                     : latency               ? ">= 0"
                                                             : "> 0"));
      f.*o.field = v * o.unit;
    }
  if (vm.count("achieved-tflops")) {  // peak x MFU given directly: MFU 1 of that peak
    const double v = vm["achieved-tflops"].as<double>();
    if (!(v > 0)) throw std::invalid_argument(fmt("--achieved-tflops %g: expected > 0", v));
    if (vm.count("peak-tflops") || vm.count("mfu"))
      throw std::invalid_argument("--achieved-tflops replaces --peak-tflops x --mfu: give one");
    f.peak_flops = v * 1e12;
    f.mfu = 1;
  }
  return f;
}

// Sets the OpenMP threads of every rank and prints, on rank 0, the machine, the binding and
// how steps are timed. Returns the load average at the start. Collective.
double set_up_threads(const po::variables_map& vm, const Options& o) {
  const int n = world().size();
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
  return start_load;
}

// Every config on its data (--data, or a synthetic corpus per vocabulary size): one model's rows
// after another. Collective.
std::vector<Row> bench_configs(const po::variables_map& vm, const Options& o) {
  const std::string data_dir = vm["data"].as<std::string>();
  std::map<uint32_t, std::string> corpora;  // vocabulary -> synthetic corpus directory
  std::vector<Row> rows;
  for (const std::string& path : vm["config"].as<std::vector<std::string>>()) {
    modtrain::RunConfig cfg = config::load(resolve(path), cli::overrides(vm));
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
  return rows;
}

// The table of every model and layout, and the scaling over the 1-rank run. Rank 0 only.
void print_summary(const std::vector<Row>& rows, double start_load) {
  const int n = world().size();
  std::printf("\n== summary: per step and rank (MB sent over dp + edp + tp + ep + world) ==\n");
  std::printf("%-20s %-13s %8s %8s %7s %8s %8s %8s %8s %8s %7s %9s\n", "model", "layout", "sent MB",
              "min MB", "ratio", "step ms", "compute", "calls", "waiting", "ceiling", "tok/s",
              "vs 1 rank");
  for (const Row& r : rows)
    std::printf("%-20s %-13s %8.3f %8.3f %7s %8.1f %8.1f %8.1f %8.1f %8.1f %7.0f %8.2fx\n",
                r.model.c_str(), r.layout.c_str(), r.sent / 1e6, r.minimum / 1e6,
                r.minimum > 0 ? fmt("%.4f", r.sent / r.minimum).c_str() : "-", 1e3 * r.seconds,
                1e3 * r.compute, 1e3 * r.in_calls, 1e3 * r.waiting, 1e3 * r.ceiling, r.tokens_per_s,
                r.vs_one);
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

}  // namespace

int main(int argc, char** argv) {
  parallel::init_world(&argc, &argv);
  po::options_description desc("parallel_bench options");
  desc.add_options()(
      "config",
      po::value<std::vector<std::string>>()->composing()->default_value(
          {"configs/recipes/tiny_dense.textproto", "configs/recipes/tiny_mod.textproto"},
          "tiny_dense and tiny_mod"),
      "RunConfig recipe (repeatable)");
  cli::add_set_option(desc, "override for every config: path.to.field=value (repeatable)");
  desc.add_options()(
      "layouts", po::value<std::string>()->default_value(""),
      "comma-separated, e.g. dp2,tp2,dp2+zero1,dp2+zero2,dp2+zero3,tp2+sp,dp2xtp2,dp2+ep2 "
      "(default: the world size's)")(
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
      "any layout, e.g. dp8,dp4xtp2,dp8+ep4 for a cluster)")(
      "fabric", po::value<std::string>(),
      "with --napkin-only, also predict each layout's step time without and with overlap on "
      "a preset: nvlink-h100 (dp and tp busbw 360 GB/s, 10 us a collective) or ib-400g (dp "
      "busbw 40 GB/s, 30 us; tp 360 GB/s, 10 us); both 989 TFLOP/s peak x MFU 0.4 per GPU. "
      "The options below override one number each")(
      "peak-tflops", po::value<double>(), "peak TFLOP/s per rank, e.g. 989 (H100 SXM, bf16)")(
      "mfu", po::value<double>(), "share of the peak the compute achieves, (0, 1], e.g. 0.4")(
      "achieved-tflops", po::value<double>(),
      "TFLOP/s per rank the compute achieves, instead of --peak-tflops x --mfu")(
      "dp-busbw", po::value<double>(),
      "GB/s per rank over dp (and edp, ep), NCCL busbw: an all-reduce of S bytes on n ranks "
      "takes 2(n-1)/n x S / busbw")(
      "tp-busbw", po::value<double>(), "GB/s per rank over tp, NCCL busbw")(
      "dp-latency-us", po::value<double>(), "microseconds per dp, edp or ep collective")(
      "tp-latency-us", po::value<double>(), "microseconds per tp collective");
  po::variables_map vm;
  try {
    if (!cli::parse(argc, argv,
                    "usage: [mpirun -n N --oversubscribe --bind-to none] parallel_bench\n"
                    "         [--config F ...] [--set f=v ...] [--layouts L,...]",
                    desc, vm, nullptr, leader())) {
      parallel::finalize_world();
      return 0;
    }
  } catch (const std::invalid_argument& e) {
    if (leader()) std::fprintf(stderr, "parallel_bench: %s\n", e.what());
    parallel::finalize_world();
    return 2;
  }

  std::optional<Fabric> fabric;
  try {
    fabric = fabric_from(vm);
  } catch (const std::invalid_argument& e) {
    if (leader()) std::fprintf(stderr, "parallel_bench: %s\n", e.what());
    parallel::finalize_world();
    return 2;
  }

  try {
    const int n = world().size();
    const Options o = options_from(vm);
    if (vm.count("napkin-only")) {
      if (leader())
        for (const std::string& path : vm["config"].as<std::vector<std::string>>()) {
          const modtrain::RunConfig cfg = config::load(resolve(path), cli::overrides(vm));
          print_napkins(
              cfg, o.layouts.empty() ? default_layouts(n, cfg.model().moe().enabled()) : o.layouts,
              fabric ? &*fabric : nullptr);
        }
      parallel::finalize_world();
      return 0;
    }
    for (const Layout& l : o.layouts) {
      if (l.pp > 1)
        fail("layout " + l.label() + ": pipeline layouts are predicted only (--napkin-only)");
      if (l.dp * l.tp != n)
        fail("layout " + l.label() + " needs dp x tp = " + std::to_string(l.dp) + " x " +
             std::to_string(l.tp) + " = " + std::to_string(l.dp * l.tp) + " ranks, the world has " +
             std::to_string(n));
    }
    const double start_load = set_up_threads(vm, o);
    const std::vector<Row> rows = bench_configs(vm, o);
    if (leader()) print_summary(rows, start_load);
  } catch (const std::exception& e) {
    parallel::abort_on_exception(e);
  }
  parallel::finalize_world();
  return 0;
}
