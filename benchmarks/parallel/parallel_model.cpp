// parallel_bench's measurement of one model: its 1-rank reference, then each layout that fits
// the world size, checked against the reference before its bytes and times are printed next to
// the napkin minimum; and --napkin-only's table. Every rank runs these; world rank 0 prints.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/parallel/parallel_bench.h"
#include "benchmarks/parallel/parallel_pipeline_napkin.h"
#include "configs/config.h"
#include "model/flops.h"
#include "model/routing_schedule.h"
#include "model/transformer.h"
#include "parallel/mesh.h"
#include "parallel/world.h"

namespace mod::bench {

using parallel::Collective;
using parallel::CountingCommunicator;
using parallel::world;

namespace {

std::string mb(double bytes) {
  return fmt("%.3f MB", bytes / 1e6);
}

// Tokens of one optimizer step: global batch x micro-batches x sequence length.
double tokens_per_step(const modtrain::RunConfig& cfg) {
  return static_cast<double>(cfg.train().batch_size()) * cfg.train().grad_accum() *
         cfg.model().seq_len();
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
    out += kind == Collective::AllReduceAsync || kind == Collective::ReduceScatterAsync ||
                   kind == Collective::AllGatherAsync
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
    config::validate(layout_config(cfg, l, 1));  // what stage 3 and sequence parallelism refuse
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

// The model's shape, its napkin parameters, and the check that the config's parameter count is
// the built model's.
void describe_model(const std::string& path, const modtrain::RunConfig& base) {
  const auto& m = base.model();
  const bool experts = m.moe().enabled();
  const double tokens = tokens_per_step(base);
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
}

// What every layout is checked against: world rank 0 trains W and W + N steps alone.
struct Reference {
  std::vector<double> losses;  // W + N steps
  double step = 0;             // seconds
  double valid_share = 1;      // see valid_slot_share
};

// The 1-rank reference, on world rank 0 alone when there are other ranks; checked (finite,
// falling, deterministic) and printed. Collective.
Reference reference_run(const modtrain::RunConfig& base, const Options& o) {
  const auto& m = base.model();
  const int n = world().size();
  const bool experts = m.moe().enabled();
  const double tokens = tokens_per_step(base);
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
  return {ref_losses, ref_step, valid_share};
}

// One layout: trained twice (W and W + N steps), both checked against the reference; the
// per-step bytes against the napkin minimum, the ceiling and the time split, printed. Collective.
Row bench_layout(const modtrain::RunConfig& base, const Layout& l, const Reference& ref,
                 const Options& o, CountingCommunicator& counted) {
  const int n = world().size(), w = o.warmup, total = o.warmup + o.steps;
  const bool experts = base.model().moe().enabled();
  const double tokens = tokens_per_step(base);
  const std::vector<double>& ref_losses = ref.losses;
  const double ref_step = ref.step;
  const Napkin nk = napkin(base, l, ref.valid_share);
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
         {nk.dp_bytes,
          l.dp > 1 ? nk.dp_formula + "\n" + std::string(24, ' ') + nk.params_formula : "(dp = 1)"}},
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
  return {base.name(),         l.label(),  f.sent(),  minimum,         f.seconds,
          f.compute(),         f.in_calls, f.waiting, ceiling.seconds, tokens / f.seconds,
          ref_step / f.seconds};
}

}  // namespace

std::vector<Row> bench_model(const std::string& path, const modtrain::RunConfig& base,
                             const Options& o) {
  const int n = world().size();
  const double tokens = tokens_per_step(base);
  describe_model(path, base);
  const Reference ref = reference_run(base, o);
  std::vector<Row> rows;
  rows.push_back({base.name(), n > 1 ? "1 rank" : "dp1", 0, 0, ref.step, ref.step, 0, 0, 0,
                  tokens / ref.step, 1.0});
  if (n == 1) return rows;  // a world of one: dp1 is the reference above
  CountingCommunicator counted(world());
  const bool experts = base.model().moe().enabled();
  for (const Layout& l : o.layouts.empty() ? default_layouts(n, experts) : o.layouts) {
    if (const std::string why = misfit(base, l); !why.empty()) {
      if (leader())
        std::printf("\nlayout %s: skipped, it does not fit: %s\n", l.label().c_str(), why.c_str());
      continue;
    }
    rows.push_back(bench_layout(base, l, ref, o, counted));
  }
  return rows;
}

// Token choice is counted as if every slot held a token (valid = 1: no measurement without
// training).
namespace {
// One pipeline layout's lines under --napkin-only: each rank's blocks and bytes, and with a
// fabric its times and the simulated bubble.
void print_pipeline(const Layout& l, const PipelinePrediction& pl, bool timed) {
  double dp = 0, tp = 0, p2p = 0;
  for (const PipelineRank& r : pl.ranks) {
    dp = std::max(dp, r.dp_bytes);
    tp = std::max(tp, r.tp_bytes);
    p2p = std::max(p2p, r.p2p_bytes);
  }
  std::printf("%-14s %s, %d micro-batches; per step, the most a pipeline rank sends: dp %s, tp %s, "
              "p2p %s\n",
              l.label().c_str(), pl.schedule.c_str(), pl.microbatches, mb(dp).c_str(),
              mb(tp).c_str(), mb(p2p).c_str());
  for (size_t r = 0; r < pl.ranks.size(); ++r) {
    const PipelineRank& pr = pl.ranks[r];
    std::printf("    rank %zu: blocks %s; %.4g parameters a GPU, state %.2f GB; dp %s, tp %s, p2p %s",
                r, pr.blocks.c_str(), pr.local, pr.state_bytes / 1e9, mb(pr.dp_bytes).c_str(),
                mb(pr.tp_bytes).c_str(), mb(pr.p2p_bytes).c_str());
    if (timed)
      std::printf("; busy %.2f ms, last backward done at %.2f ms, gradients %.2f ms (%.2f ms after "
                  "it with overlap)",
                  1e3 * pr.busy, 1e3 * pr.finish, 1e3 * pr.grad_comm, 1e3 * pr.grad_exposed);
    if (timed && pr.tp_step > 0)
      std::printf("; sequence-partial gradients over tp %.2f ms", 1e3 * pr.tp_step);
    std::printf("\n");
  }
  if (timed)
    std::printf("    bubble: %.4f simulated with these stages and %.3f ms a transfer (equal stages, "
                "free transfers: (pp-1)/(v m+pp-1) = %.4f)\n",
                pl.bubble, 1e3 * pl.transfer, pl.bubble_equal);
}
}  // namespace

void print_napkins(const modtrain::RunConfig& cfg, const std::vector<Layout>& layouts,
                   const Fabric* fabric) {
  const auto& m = cfg.model();
  std::printf(
      "\n== %s: D %d, %d layers, F %d, V %d, T %d, global batch %d x %d micro-batches "
      "==\n",
      cfg.name().c_str(), m.d_model(), m.n_layers(), m.d_ff(), m.vocab_size(), m.seq_len(),
      cfg.train().batch_size(), cfg.train().grad_accum());
  std::vector<std::pair<Layout, StepTime>> times;
  std::vector<std::pair<Layout, PipelinePrediction>> pipelines;
  for (const Layout& l : layouts) {
    std::string why = misfit(cfg, l);
    if (why.empty() && l.pp > 1) why = pipeline_misfit(cfg, l);
    if (!why.empty()) {
      std::printf("%-14s does not fit: %s\n", l.label().c_str(), why.c_str());
      continue;
    }
    if (l.pp > 1) {  // the bytes need no fabric; the times do
      const PipelinePrediction pl =
          predict_pipeline(cfg, l, fabric ? *fabric : fabric_preset("nvlink-h100"));
      print_pipeline(l, pl, fabric != nullptr);
      if (fabric) pipelines.emplace_back(l, pl);
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
    if (!fabric) continue;
    const StepTime t = predict_step(cfg, l, nk, *fabric);
    times.emplace_back(l, t);
    std::printf("    time: compute %.2f ms (the last micro-batch's backward %.2f ms); ",
                1e3 * t.compute, 1e3 * t.last_backward);
    if (l.stage3())
      std::printf("%d reduce-scatters, one per unit: %.2f ms, %.2f ms of it after backward with "
                  "overlap",
                  t.buckets, 1e3 * t.grad_comm, 1e3 * t.exposed_grad);
    else
      std::printf("%d gradient bucket%s of parallel.bucket_mb %g MiB: %.2f ms, %.2f ms of it "
                  "after backward with overlap",
                  t.buckets, t.buckets == 1 ? "" : "s", cfg.parallel().bucket_mb(),
                  1e3 * t.grad_comm, 1e3 * t.exposed_grad);
    if (l.stage3() && l.dp > 1)
      std::printf("; ZeRO-3 all-gathers %.2f ms; with prefetch compute waits %.2f ms on them "
                  "(on a stream shared with the reduce-scatters), without %.2f ms more",
                  1e3 * t.gather, 1e3 * t.exposed_gather,
                  1e3 * (t.exposed_dp_no_prefetch - t.exposed_gather - t.exposed_grad));
    else if (l.sharded())
      std::printf("; ZeRO all-gather %.2f ms", 1e3 * t.gather);
    if (l.tp > 1) std::printf("; tp %.2f ms in %d calls", 1e3 * t.tp, t.tp_calls);
    if (l.ep > 1) std::printf("; ep %.2f ms in %d calls", 1e3 * t.ep, t.ep_calls);
    std::printf("\n");
  }
  if (!fabric || (times.empty() && pipelines.empty())) return;
  const model::FlopCount flops = model::count_flops(m);
  std::printf(
      "\npredicted per step and rank, %s: %.4g training FLOPs a token x %.0f tokens a step; "
      "%s\n",
      cfg.name().c_str(), flops.training_per_token, tokens_per_step(cfg),
      fabric->describe().c_str());
  std::printf("%-14s %-7s %9s %10s %9s %10s %10s\n", "layout", "overlap", "step ms", "compute ms",
              "comm ms", "exposed ms", "tok/s/GPU");
  for (const auto& [l, t] : times)
    for (bool overlap : {false, true})
      std::printf("%-14s %-7s %9.2f %10.2f %9.2f %10.2f %10.0f\n", l.label().c_str(),
                  overlap ? "yes" : "no", 1e3 * t.step(overlap), 1e3 * t.compute, 1e3 * t.comm(),
                  1e3 * t.exposed(overlap), tokens_per_step(cfg) / t.step(overlap) / (l.dp * l.tp));
  std::printf(
      "(predictions, not measurements: compute = FLOPs / (dp x tp) / (peak x MFU); comm = bytes "
      "/ busbw + latency per collective; with overlap the gradient buckets travel during the "
      "last micro-batch's backward, one at a time in launch order; tp (sequence parallel "
      "too), ep and ZeRO-1/2's all-gather are always exposed; ZeRO-3 with overlap: each "
      "unit's all-gather prefetched one unit ahead and its reduce-scatter at the end of its "
      "backward, all on one comm stream in the order issued, exposed = compute's stalls on a "
      "gather + what follows the last backward)\n");
  if (pipelines.empty()) return;
  // Beside the layouts without stages: the training state a GPU must hold, which is what
  // pipelining buys.
  std::printf("\nwith pipeline stages, %s:\n%-16s %-7s %9s %9s %7s %10s %10s %12s\n",
              cfg.name().c_str(), "layout", "overlap", "step ms", "busy ms", "bubble",
              "exposed ms", "tok/s/GPU", "state GB/GPU");
  for (const auto& [l, t] : times)
    for (bool overlap : {false, true})
      std::printf("%-16s %-7s %9.2f %9.2f %7s %10.2f %10.0f %12.1f\n", l.label().c_str(),
                  overlap ? "yes" : "no", 1e3 * t.step(overlap), 1e3 * (t.compute + t.tp + t.ep),
                  "-", 1e3 * (t.step(overlap) - t.compute - t.tp - t.ep),
                  tokens_per_step(cfg) / t.step(overlap) / l.world(),
                  state_bytes(napkin(cfg, l).local, l) / 1e9);
  for (const auto& [l, pl] : pipelines)
    for (bool overlap : {false, true})
      std::printf("%-16s %-7s %9.2f %9.2f %7.4f %10.2f %10.0f %12.1f\n", l.label().c_str(),
                  overlap ? "yes" : "no", 1e3 * pl.step(overlap), 1e3 * pl.busiest(), pl.bubble,
                  1e3 * (pl.step(overlap) - pl.makespan),
                  tokens_per_step(cfg) / pl.step(overlap) / l.world(), [&] {
                    double most = 0;
                    for (const PipelineRank& r : pl.ranks) most = std::max(most, r.state_bytes);
                    return most / 1e9;
                  }());
  std::printf(
      "(pipeline: the schedule simulated with each stage's compute and tp time and each transfer "
      "of a [B/dp, T, D] f32 activation ([B/dp, T/tp, D] with +sp) over the dp fabric; busy = the "
      "busiest rank's compute and tp; exposed = what the gradients, ZeRO's all-gather and SP's "
      "partial gradients add after the pipeline drains; "
      "state = f32 parameters, gradients and AdamW moments of the fullest GPU, no activations)\n");
}

}  // namespace mod::bench
