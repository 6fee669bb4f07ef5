// Stage partition by predicted cost, and the pipeline table of `flops` and `memory` (see
// pipeline_partition.h).
#include "parallel/pipeline_partition.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "model/flops.h"
#include "model/memory_plan.h"
#include "model/parameter_shapes.h"
#include "parallel/pipeline_memory.h"

namespace mod::parallel {

int PipelinePartition::first_block(int stage) const {
  int b = 0;
  for (int s = 0; s < stage; ++s) b += blocks[s];
  return b;
}

int PipelinePartition::stage_of_block(int block) const {
  for (int s = 0, first = 0; s < stages(); first += blocks[s], ++s)
    if (block < first + blocks[s]) return s;
  throw std::out_of_range("pipeline partition: block " + std::to_string(block) + " is in no stage");
}

double PipelinePartition::largest() const {
  return *std::max_element(forward_per_token.begin(), forward_per_token.end());
}

std::vector<int> balance_blocks(const std::vector<double>& cost, double head_cost, int stages) {
  const int n = static_cast<int>(cost.size());
  if (stages < 1 || stages > n)
    throw std::invalid_argument("balance_blocks: " + std::to_string(stages) + " stages for " +
                                std::to_string(n) + " blocks (each stage needs one)");
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  struct Best { double max, sumsq; int cut; };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the first i blocks in s stages; cut = where stage s begins.
  std::vector<std::vector<Best>> best(stages + 1, std::vector<Best>(n + 1, {inf, inf, -1}));
  best[0][0] = {0, 0, 0};
  for (int s = 1; s <= stages; ++s)
    for (int i = s; i <= n - (stages - s); ++i)
      for (int j = s - 1; j < i; ++j) {
        const Best& prev = best[s - 1][j];
        if (prev.cut < 0) continue;
        const double c = prefix[i] - prefix[j] + (s == stages ? head_cost : 0.0);
        const Best cand{std::max(prev.max, c), prev.sumsq + c * c, j};
        Best& cur = best[s][i];
        if (cand.max < cur.max || (cand.max == cur.max && cand.sumsq < cur.sumsq)) cur = cand;
      }
  std::vector<int> out(stages);
  for (int s = stages, i = n; s >= 1; --s) {
    const int j = best[s][i].cut;
    out[s - 1] = i - j;
    i = j;
  }
  return out;
}

std::vector<int> equal_block_counts(int n, int stages) {
  std::vector<int> out(stages, n / stages);
  for (int s = 0; s < n % stages; ++s) ++out[s];
  return out;
}

PipelineScheduleKind schedule_kind(const modtrain::ParallelConfig& p) {
  switch (p.pp_schedule()) {
    case modtrain::ParallelConfig::GPIPE: return PipelineScheduleKind::GPipe;
    case modtrain::ParallelConfig::INTERLEAVED_1F1B: return PipelineScheduleKind::Interleaved1F1B;
    default: return PipelineScheduleKind::OneFOneB;
  }
}

PipelinePartition partition_with(const modtrain::ModelConfig& model, int pp, int v,
                                 const std::vector<int>& blocks, bool by_hand) {
  const model::FlopCount f = model::count_flops(model);
  PipelinePartition out{pp, v, by_hand, blocks, {}};
  int b = 0;
  for (size_t s = 0; s < blocks.size(); ++s) {
    double c = s + 1 == blocks.size() ? f.lm_head_per_token : 0.0;
    for (int k = 0; k < blocks[s]; ++k) c += f.blocks.at(b++).forward_per_token;
    out.forward_per_token.push_back(c);
  }
  if (b != model.n_layers())
    throw std::invalid_argument("pipeline partition: stages hold " + std::to_string(b) +
                                " blocks, expected model.n_layers " + std::to_string(model.n_layers()));
  return out;
}

PipelinePartition plan_partition(const modtrain::RunConfig& cfg) {
  const auto& p = cfg.parallel();
  const int pp = p.pp(), v = p.virtual_stages();
  if (p.pp_layout_size() > 0)
    return partition_with(cfg.model(), pp, v, {p.pp_layout().begin(), p.pp_layout().end()}, true);
  const model::FlopCount f = model::count_flops(cfg.model());
  std::vector<double> cost;
  for (const auto& b : f.blocks) cost.push_back(b.forward_per_token);
  return partition_with(cfg.model(), pp, v, balance_blocks(cost, f.lm_head_per_token, pp * v), false);
}

namespace {

std::string block_range(const PipelinePartition& part, int stage) {
  const int first = part.first_block(stage), last = first + part.blocks[stage] - 1;
  return first == last ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(last);
}

// Parameter elements of each virtual stage: its blocks; the embedding on the first; the final
// norm and LM head on the last (with tied embeddings the last stage keeps its own copy of the
// embedding as the head, as Megatron does, and the two copies' gradients are summed).
std::vector<double> stage_parameters(const modtrain::ModelConfig& model, const PipelinePartition& part) {
  std::vector<double> out(part.stages(), 0.0);
  const int last = part.stages() - 1;
  for (const auto& [name, shape] : model::parameter_shapes(model)) {
    double elems = 1;
    for (int64_t d : shape) elems *= static_cast<double>(d);
    if (name.rfind("blocks.", 0) == 0) {
      out[part.stage_of_block(std::stoi(name.substr(7)))] += elems;
    } else if (name.rfind("embed.", 0) == 0) {
      out[0] += elems;
      if (model.tie_embeddings() && last > 0) out[last] += elems;
    } else {
      out[last] += elems;
    }
  }
  return out;
}

}  // namespace

std::vector<double> rank_step_flops(const modtrain::RunConfig& cfg) {
  const auto& p = cfg.parallel();
  const PipelinePartition part = plan_partition(cfg);
  const double tokens = static_cast<double>(cfg.train().batch_size()) / p.dp() *
                        cfg.model().seq_len() * cfg.train().grad_accum();
  std::vector<double> out(p.pp(), 0.0);
  for (int s = 0; s < part.stages(); ++s)
    out[part.rank_of(s)] += 3 * part.forward_per_token[s] * tokens / std::max(1, p.tp());
  return out;
}

std::string describe_pipeline(const modtrain::RunConfig& cfg) {
  const auto& p = cfg.parallel();
  if (p.pp() <= 1) return "";
  const int pp = p.pp(), v = p.virtual_stages(), m = cfg.train().grad_accum();
  const PipelinePartition part = plan_partition(cfg);
  const PipelineSchedule sched = make_schedule(schedule_kind(p), pp, m, v);
  StageCosts costs = StageCosts::uniform(pp, v, 0, 0);
  for (int s = 0; s < part.stages(); ++s) {
    costs.forward[s % pp][s / pp] = part.forward_per_token[s];
    costs.backward[s % pp][s / pp] = 2 * part.forward_per_token[s];
  }
  const ScheduleSimulation sim = simulate_schedule(sched, costs);

  const double tokens = static_cast<double>(cfg.train().batch_size()) / p.dp() * cfg.model().seq_len();
  const model::MemoryPlan mem = model::plan_memory(cfg);
  const std::vector<double> params = stage_parameters(cfg.model(), part);

  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line,
                "pipeline: pp %d, %s, %d virtual stage(s) per rank, %d micro-batches (train.grad_accum) "
                "of %.0f tokens per rank\npartition: %s\n",
                pp, schedule_name(sched.kind), v, m, tokens,
                part.by_hand ? "by hand (parallel.pp_layout)"
                             : "balanced by predicted forward+backward FLOPs (parallel.pp_layout overrides)");
  os << line
     << "stage  rank  blocks  fwd+bwd GFLOP/micro-batch  time vs slowest  params  in flight  "
        "activations\n";
  const int last = part.stages() - 1;
  for (int s = 0; s < part.stages(); ++s) {
    const int r = s % pp;
    double kept = 0;
    for (int b = part.first_block(s); b < part.first_block(s) + part.blocks[s]; ++b)
      kept += mem.blocks[b].kept;
    if (s == last) kept += mem.head_kept;
    // The schedule's in-flight count is in chunk micro-batches; with v chunks, the rank's share.
    const double flight = static_cast<double>(sim.max_in_flight[r]) / v;
    std::snprintf(line, sizeof line, "%5d  %4d  %6s  %25.4g  %15.3f  %5.2fM  %9.2f  %11s\n", s, r,
                  block_range(part, s).c_str(), 3 * part.forward_per_token[s] * tokens / 1e9,
                  part.forward_per_token[s] / part.largest(), params[s] / 1e6, flight,
                  model::format_bytes(flight * kept).c_str());
    os << line;
  }
  // The layer-count split Megatron and torchtitan default to, for comparison.
  const PipelinePartition equal =
      partition_with(cfg.model(), pp, v, equal_block_counts(cfg.model().n_layers(), pp * v), false);
  double total = 0;
  for (double c : part.forward_per_token) total += c;
  const double mean = total / part.stages();
  std::snprintf(line, sizeof line,
                "slowest stage / mean: %.3f (an equal block count per stage: %.3f)\n"
                "bubble: (pp-1)/(v m+pp-1) = %.4f for equal stages; simulated with these stages' "
                "FLOPs: %.4f\n",
                part.largest() / mean, equal.largest() / mean, predicted_bubble(pp, m, v),
                sim.bubble_fraction());
  os << line;
  // Per device: pp rank r is world ranks r x dp x tp .. (r + 1) x dp x tp - 1 (tp fastest, then
  // dp, then pp: mesh.h), each doing its rank's share.
  const std::vector<double> per_rank = rank_step_flops(cfg);
  const int width = p.dp() * std::max(1, p.tp());
  const double slowest = *std::max_element(per_rank.begin(), per_rank.end());
  double step_total = 0;
  std::snprintf(line, sizeof line,
                "compute per device a step (%d micro-batches of %.0f tokens per dp rank, / tp %d):\n"
                "pp rank  world ranks  stages  fwd+bwd GFLOP/step  vs slowest\n",
                m, tokens, std::max(1, p.tp()));
  os << line;
  for (int r = 0; r < pp; ++r) {
    std::string stages;
    for (int c = 0; c < v; ++c) stages += (c ? "," : "") + std::to_string(c * pp + r);
    const std::string ranks = width == 1 ? std::to_string(r)
                                         : std::to_string(r * width) + "-" +
                                               std::to_string((r + 1) * width - 1);
    std::snprintf(line, sizeof line, "%7d  %11s  %6s  %18.4g  %10.3f\n", r, ranks.c_str(),
                  stages.c_str(), per_rank[r] / 1e9, per_rank[r] / slowest);
    os << line;
    step_total += per_rank[r] * width;
  }
  std::snprintf(line, sizeof line,
                "the step: %.4g GFLOP over %d devices; the slowest does %.3f of an even share\n",
                step_total / 1e9, pp * width, slowest / (step_total / (pp * width)));
  os << line;
  os << describe_pipeline_memory(plan_pipeline_memory(cfg));
  return os.str();
}

}  // namespace mod::parallel
