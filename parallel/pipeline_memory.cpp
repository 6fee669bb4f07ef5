// Peak memory per pipeline rank (see pipeline_memory.h).
#include "parallel/pipeline_memory.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "configs/config.h"
#include "model/memory_plan.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"

namespace mod::parallel {

namespace {

// The rank's walk through its actions: `live` is everything held but the running op's
// temporaries; visit() records the largest live + temporaries seen.
struct Walk {
  double base = 0, grads = 0, kept = 0, transfers = 0, most_kept = 0;
  PipelineRankMemory* out = nullptr;
  double live() const { return base + grads + kept + transfers; }
  void visit(double temporaries, const std::string& where) {
    if (live() + temporaries > out->peak) {
      out->peak = live() + temporaries;
      out->peak_at = where;
    }
  }
};

}  // namespace

std::vector<PipelineRankMemory> plan_pipeline_memory(const modtrain::RunConfig& cfg) {
  const auto& p = cfg.parallel();
  if (p.pp() <= 1) throw std::invalid_argument("plan_pipeline_memory: parallel.pp is 1");
  if (config::zero_stage(p) >= 3)
    throw std::invalid_argument("plan_pipeline_memory: parallel.zero_stage 3 under pp is not modelled");
  const int pp = p.pp(), v = p.virtual_stages(), m = cfg.train().grad_accum();
  const PipelinePartition part = plan_partition(cfg);
  const PipelineSchedule sched = make_schedule(schedule_kind(p), pp, m, v);
  const model::MemoryOptions opt = model::memory_options(cfg);
  const model::MemoryPlan mem = model::plan_memory(cfg.model(), opt);
  const int last = part.stages() - 1;
  const bool tie = cfg.model().tie_embeddings();
  // The runtime sends [b, T, D] in f32 whatever the compute dtype (pipeline_runtime.cpp); under
  // sequence parallelism each tp rank its [b, T/tp, D].
  const double seq_share = p.sequence_parallel() && p.tp() > 1 ? 1.0 / p.tp() : 1.0;
  const double transfer = 4.0 * static_cast<double>(opt.batch_per_rank) * cfg.model().seq_len() *
                          seq_share * cfg.model().d_model();

  std::vector<PipelineRankMemory> out;
  for (int r = 0; r < pp; ++r) {
    PipelineRankMemory rm;
    rm.rank = r;
    // What the rank owns (pipeline_runtime.h stage_owns), dense and experts apart.
    double dense = 0, experts = 0;
    for (int c = 0; c < v; ++c) {
      const int s = sched.virtual_stage(r, c);
      for (int b = part.first_block(s); b < part.first_block(s) + part.blocks[s]; ++b) {
        dense += mem.blocks[b].parameters - mem.blocks[b].expert_parameters;
        experts += mem.blocks[b].expert_parameters;
      }
      if (s == 0) dense += mem.embedding_parameters;
      if (s == last) dense += mem.head_parameters + (tie ? mem.embedding_parameters : 0);
    }
    rm.owned = dense + experts;
    rm.parameters = rm.owned;  // the other stages' released after set-up
    const model::ReducedState reduced = model::reduced_state(opt.layout, dense, experts);
    rm.optimizer = opt.layout.zero_stage >= 1 ? reduced.optimizer : 2 * rm.owned;
    rm.buckets = reduced.buckets;

    Walk w;
    w.out = &rm;
    w.base = rm.parameters + rm.optimizer + rm.buckets;
    std::vector<bool> has_grads(v, false);
    std::vector<double> chunk_grads(v, 0.0);
    for (const PipeAction& a : sched.ranks[r]) {
      const int s = sched.virtual_stage(r, a.chunk), first = part.first_block(s),
                end = first + part.blocks[s];
      const std::string mb = " of micro-batch " + std::to_string(a.microbatch);
      if (a.op == PipeOp::Forward) {
        for (int b = first; b < end; ++b) w.kept += mem.blocks[b].kept;
        if (s == last) w.kept += mem.head_kept;
        w.most_kept = std::max(w.most_kept, w.kept);
        w.visit(0, "end of forward" + mb);
        if (s != last) w.transfers += transfer;  // the output, held by its send
      } else if (a.op == PipeOp::Backward) {
        const bool first_time = !has_grads[a.chunk];
        double made = 0;  // this chunk's gradients this backward adds
        auto add = [&](double bytes) {
          if (!first_time) return;
          w.grads += bytes;
          made += bytes;
        };
        if (s == last) {
          w.visit(mem.head_backward_temp, "backward of the LM head" + mb);
          w.kept -= mem.head_kept;
          add(mem.head_parameters + (tie ? mem.embedding_parameters : 0));
        }
        for (int b = end - 1; b >= first; --b) {
          w.visit(mem.stream_grad + mem.blocks[b].backward_temp,
                  "backward of block " + std::to_string(b) + mb);
          w.kept -= mem.blocks[b].kept;
          add(mem.blocks[b].parameters);
        }
        if (s == 0) {
          w.visit(mem.embedding_backward_temp, "backward of the embedding" + mb);
          add(mem.embedding_parameters);
        } else {
          w.transfers += transfer;  // the input's gradient, held by its send
        }
        has_grads[a.chunk] = true;
        chunk_grads[a.chunk] += made;
        // ZeRO-2: the chunk's last backward packs its full gradients into the buckets' owned
        // slices (already in base) and drops them.
        if (reduced.releases && a.microbatch == m - 1) {
          w.grads -= chunk_grads[a.chunk];
          chunk_grads[a.chunk] = 0;
        }
      }
    }
    rm.gradients = rm.owned;
    rm.activations = w.most_kept;
    rm.transfers = w.transfers;
    // The step's end frees the sends; ZeRO's update then all-gathers the owned slices.
    w.transfers = 0;
    if (opt.layout.zero_stage >= 1)
      w.visit(rm.owned + rm.owned / opt.layout.dp, "ZeRO all-gather");
    out.push_back(rm);
  }
  return out;
}

double predicted_peak(const modtrain::RunConfig& cfg) {
  if (cfg.parallel().pp() <= 1 || config::zero_stage(cfg.parallel()) >= 3)
    return model::plan_memory(cfg).peak;
  double peak = 0;
  for (const PipelineRankMemory& r : plan_pipeline_memory(cfg)) peak = std::max(peak, r.peak);
  return peak;
}

std::string describe_pipeline_memory(const std::vector<PipelineRankMemory>& ranks) {
  std::ostringstream os;
  char line[256];
  os << "memory per rank (predicted; every rank holds the parameters it owns, their "
        "gradients and moments, the other stages' released; MiB):\n"
        "rank  parameters  owned  gradients  optimizer  buckets  kept (most)  sends   peak  peak at\n";
  auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  for (const PipelineRankMemory& r : ranks) {
    std::snprintf(line, sizeof line,
                  "%4d  %10.1f  %5.1f  %9.1f  %9.1f  %7.1f  %11.1f  %5.1f  %5.1f  %s\n", r.rank,
                  mib(r.parameters), mib(r.owned), mib(r.gradients), mib(r.optimizer),
                  mib(r.buckets), mib(r.activations), mib(r.transfers),
                  mib(r.peak), r.peak_at.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace mod::parallel
