// Peak memory per pipeline rank (see pipeline_memory.h).
#include "parallel/pipeline_memory.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "model/memory_plan.h"
#include "parallel/pipeline_issue_order.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"

namespace mod::parallel {

namespace {

// The rank's walk through what it issues: `live` is everything held but the running op's
// temporaries; visit() records the largest live + temporaries seen.
struct Walk {
  double base = 0, grads = 0, kept = 0, transfers = 0, receives = 0, most_kept = 0,
         most_received = 0;
  PipelineRankMemory* out = nullptr;
  double live() const { return base + grads + kept + transfers + receives; }
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
  const int pp = p.pp(), v = p.virtual_stages(), m = cfg.train().grad_accum();
  const PipelinePartition part = plan_partition(cfg);
  const PipelineSchedule sched = make_schedule(schedule_kind(p), pp, m, v);
  const std::vector<std::vector<IssueStep>> order = issue_order(sched);
  const model::MemoryOptions opt = model::memory_options(cfg);
  const model::MemoryPlan mem = model::plan_memory(cfg.model(), opt);
  const int last = part.stages() - 1, zero = opt.layout.zero_stage;
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
    // What the rank owns (pipeline_runtime.h stage_owns), dense and experts apart; ZeRO-3's
    // outer unit (the embedding on the first stage, final norm and head on the last, the tied
    // embedding on both) and largest block among them.
    double dense = 0, experts = 0, outer = 0, largest_block = 0;
    for (int c = 0; c < v; ++c) {
      const int s = sched.virtual_stage(r, c);
      for (int b = part.first_block(s); b < part.first_block(s) + part.blocks[s]; ++b) {
        dense += mem.blocks[b].parameters - mem.blocks[b].expert_parameters;
        experts += mem.blocks[b].expert_parameters;
        largest_block = std::max(largest_block, mem.blocks[b].parameters);
      }
      if (s == 0) outer += mem.embedding_parameters;
      if (s == last) outer += mem.head_parameters + (tie ? mem.embedding_parameters : 0);
    }
    dense += outer;
    rm.owned = dense + experts;
    // The other stages' released after set-up; ZeRO-3 shards the rank's own over its dp group.
    rm.parameters = zero >= 3 ? model::zero3_parameters(opt.layout, dense, experts, outer,
                                                        model::zero3_f32_units(opt.layout, largest_block))
                              : rm.owned;
    const model::ReducedState reduced = model::reduced_state(opt.layout, dense, experts);
    rm.optimizer = zero >= 1 ? reduced.optimizer : 2 * rm.owned;
    rm.buckets = reduced.buckets;

    Walk w;
    w.out = &rm;
    w.base = rm.parameters + rm.optimizer + rm.buckets;
    std::vector<bool> has_grads(v, false);
    std::vector<double> chunk_grads(v, 0.0);
    // Receive buffers posted and not yet consumed, per micro-batch and chunk: an activation's
    // until its forward (then its first block keeps it), a gradient's until its backward ends.
    std::vector<std::vector<bool>> input_posted(m, std::vector<bool>(v, false)),
        grad_posted = input_posted;
    const std::vector<PipeAction>& actions = sched.ranks[r];
    for (const IssueStep& step : order[r]) {
      if (step.transfers) {
        // A receive's buffer is allocated when its round is issued, possibly computes ahead
        // of the compute that reads it (pipeline_issue_order.h).
        for (size_t k : step.actions) {
          const PipeAction& a = actions[k];
          if (a.op != PipeOp::RecvActivation && a.op != PipeOp::RecvGrad) continue;
          (a.op == PipeOp::RecvActivation ? input_posted : grad_posted)[a.microbatch][a.chunk] = true;
          w.receives += transfer;
        }
        w.most_received = std::max(w.most_received, w.receives);
        continue;
      }
      const PipeAction& a = actions[step.actions.at(0)];
      const int s = sched.virtual_stage(r, a.chunk), first = part.first_block(s),
                end = first + part.blocks[s];
      const std::string mb = " of micro-batch " + std::to_string(a.microbatch);
      if (a.op == PipeOp::Forward) {
        if (input_posted[a.microbatch][a.chunk]) {  // now its first block's kept input
          input_posted[a.microbatch][a.chunk] = false;
          w.receives -= transfer;
        }
        for (int b = first; b < end; ++b) w.kept += mem.blocks[b].kept;
        if (s == last) w.kept += mem.head_kept;
        w.most_kept = std::max(w.most_kept, w.kept);
        w.visit(0, "end of forward" + mb);
        if (s == last) w.visit(mem.head_forward_temp, "forward of the fused LM head" + mb);
        if (s != last) w.transfers += transfer;  // the output, held by its send
      } else if (a.op == PipeOp::Backward) {
        const bool first_time = !has_grads[a.chunk];
        // The received gradient is the last block's incoming one; held to the backward's end.
        const bool received = grad_posted[a.microbatch][a.chunk];
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
          const double incoming = received && b == end - 1 ? 0 : mem.stream_grad;
          w.visit(incoming + mem.blocks[b].backward_temp,
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
        if (received) {
          grad_posted[a.microbatch][a.chunk] = false;
          w.receives -= transfer;
        }
        has_grads[a.chunk] = true;
        chunk_grads[a.chunk] += made;
        // ZeRO-2 and -3: the chunk's last backward packs its full gradients into the buckets'
        // owned slices (already in base) and drops them.
        if (reduced.releases && a.microbatch == m - 1) {
          w.grads -= chunk_grads[a.chunk];
          chunk_grads[a.chunk] = 0;
        }
      }
    }
    rm.gradients = rm.owned;
    rm.activations = w.most_kept;
    rm.transfers = w.transfers;
    rm.receives = w.most_received;
    // The step's end frees the sends; ZeRO-1 and -2's update then all-gather the owned slices
    // (ZeRO-3 keeps them sharded).
    w.transfers = 0;
    if (zero == 1 || zero == 2)
      w.visit(rm.owned + rm.owned / opt.layout.dp, "ZeRO all-gather");
    out.push_back(rm);
  }
  return out;
}

double predicted_peak(const modtrain::RunConfig& cfg) {
  if (cfg.parallel().pp() <= 1)
    return model::plan_memory(cfg).peak;
  double peak = 0;
  for (const PipelineRankMemory& r : plan_pipeline_memory(cfg)) peak = std::max(peak, r.peak);
  return peak;
}

std::string describe_pipeline_memory(const std::vector<PipelineRankMemory>& ranks) {
  std::ostringstream os;
  char line[256];
  os << "memory per rank (predicted; every rank holds the parameters it owns, their "
        "gradients and moments, the other stages' released; ZeRO-3: parameters held, owned "
        "slices and gathered units; MiB):\n"
        "pp rank  parameters  owned  gradients  optimizer  buckets  kept (most)  sends  receives   peak  peak at\n";
  auto mib = [](double b) { return b / (1024.0 * 1024.0); };
  for (const PipelineRankMemory& r : ranks) {
    std::snprintf(line, sizeof line,
                  "%7d  %10.1f  %5.1f  %9.1f  %9.1f  %7.1f  %11.1f  %5.1f  %8.1f  %5.1f  %s\n",
                  r.rank, mib(r.parameters), mib(r.owned), mib(r.gradients), mib(r.optimizer),
                  mib(r.buckets), mib(r.activations), mib(r.transfers), mib(r.receives),
                  mib(r.peak), r.peak_at.c_str());
    os << line;
  }
  return os.str();
}

}  // namespace mod::parallel
