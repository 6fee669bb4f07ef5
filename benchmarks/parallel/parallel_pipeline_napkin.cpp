// Bytes and step time of layouts with pipeline stages (see parallel_pipeline_napkin.h).
#include "benchmarks/parallel/parallel_pipeline_napkin.h"

#include <algorithm>
#include <cmath>

#include "model/parameter_shapes.h"
#include "model/routing_schedule.h"
#include "parallel/pipeline_partition.h"
#include "parallel/pipeline_schedule.h"

namespace mod::bench {

double PipelinePrediction::step(bool overlap) const {
  double out = 0;
  for (const PipelineRank& r : ranks)
    out = std::max(out, r.finish + r.tp_step + (overlap ? r.grad_exposed : r.grad_comm) + r.gather);
  return out;
}

double PipelinePrediction::busiest() const {
  double out = 0;
  for (const PipelineRank& r : ranks) out = std::max(out, r.busy);
  return out;
}

std::string pipeline_misfit(const modtrain::RunConfig& cfg, const Layout& l) {
  const auto& m = cfg.model();
  if (m.moe().enabled()) return "MoE blocks under pp are not modelled here";
  if (l.ep > 1) return "ep under pp is not modelled here";
  if (l.stage3()) return "ZeRO-3 under pp is not modelled here";
  if (m.n_layers() < l.pp * l.v)
    return fmt("model.n_layers %.0f < pp x v = %.0f stages of a block at least", m.n_layers(),
               l.pp * l.v);
  const int mb = cfg.train().grad_accum();
  if (l.v > 1 && mb % l.pp != 0)
    return fmt("interleaved 1F1B needs train.grad_accum (%.0f) to be a multiple of pp %.0f", mb,
               l.pp);
  return "";
}

namespace {

struct Stage {  // one virtual stage, per micro-batch on one GPU
  double split = 0, replicated = 0;  // parameter elements (tp splits the first)
  double seq_partial = 0;  // of the replicated ones, those SP sums over tp once a step
  double tp_forward = 0, tp_backward = 0;  // bytes of its tp collectives
  int tp_calls_forward = 0, tp_calls_backward = 0;
};

// Each virtual stage's parameters and tp traffic, the way parallel_napkin.cpp counts the whole
// model's: 2 all-reduces of [B/dp, T_b, D] per block forward and 2 backward; the embedding's
// output on the first stage (forward), the head's input (backward) and the vocabulary-parallel
// loss's statistics on the last. Sequence parallelism sends the same bytes as an all-gather and
// a reduce-scatter for each all-reduce (twice the calls; the embedding's and the head's half
// forward, half backward), plus per routed block its gathered rows [B/dp, C, D] all-reduced
// forward and their gradient backward, and calls for its scores, predictor logits and causal
// loss (4 B x T a sequence each, left out of the bytes as in parallel_napkin.cpp).
std::vector<Stage> stages_of(const modtrain::RunConfig& cfg, const Layout& l,
                             const parallel::PipelinePartition& part) {
  const auto& m = cfg.model();
  const int n = part.stages(), last = n - 1;
  const std::vector<bool> routed = model::routed_blocks(m);
  std::vector<Stage> out(n);
  for (const auto& [name, shape] : model::parameter_shapes(m)) {
    double elems = 1;
    for (int64_t d : shape) elems *= static_cast<double>(d);
    auto add = [&](int s) {
      (tp_split_parameter(name) ? out[s].split : out[s].replicated) += elems;
      if (l.sp && seq_partial_parameter(name, routed)) out[s].seq_partial += elems;
    };
    if (name.rfind("blocks.", 0) == 0) {
      add(part.stage_of_block(std::stoi(name.substr(7))));
    } else if (name.rfind("embed.", 0) == 0) {
      add(0);
      if (m.tie_embeddings() && last > 0) add(last);  // the last stage's copy as the head
    } else {
      add(last);
    }
  }
  if (l.tp == 1) return out;
  const double tp = l.tp, ring = 2 * (tp - 1) / tp, rows = cfg.train().batch_size() / l.dp;
  const double t = m.seq_len(), row_bytes = 4.0 * m.d_model();  // one f32 position of [., ., D]
  const auto capacities = model::block_capacities(m);
  for (int s = 0; s < n; ++s) {
    double positions = 0;  // sum of T_b over its blocks
    double routed_rows = 0;  // sum of C over its routed blocks
    int routed_blocks = 0;
    for (int b = part.first_block(s); b < part.first_block(s) + part.blocks[s]; ++b) {
      positions += static_cast<double>(capacities[b]);
      if (routed[b]) {
        routed_rows += static_cast<double>(capacities[b]);
        ++routed_blocks;
      }
    }
    Stage& st = out[s];
    if (l.sp) {
      // The embedding's reduce-scatter forward and all-gather backward; the head's all-gather
      // forward and reduce-scatter backward: each half an all-reduce's bytes.
      const double ends = (s == 0 ? t / 2 : 0) + (s == last ? t / 2 : 0);
      st.tp_forward = ring * rows * row_bytes * (2 * positions + routed_rows + ends);
      st.tp_backward = ring * rows * row_bytes * (2 * positions + routed_rows + ends);
      const int end_calls = (s == 0 ? 1 : 0) + (s == last ? 1 : 0);
      st.tp_calls_forward = 4 * part.blocks[s] + end_calls + 4 * routed_blocks;
      st.tp_calls_backward = 4 * part.blocks[s] + end_calls + routed_blocks;
    } else {
      st.tp_forward = ring * rows * row_bytes * (2 * positions + (s == 0 ? t : 0));
      st.tp_backward = ring * rows * row_bytes * (2 * positions + (s == last ? t : 0));
      st.tp_calls_forward = 2 * part.blocks[s] + (s == 0 ? 1 : 0);
      st.tp_calls_backward = 2 * part.blocks[s] + (s == last ? 1 : 0);
    }
    if (s == last) {
      st.tp_forward += ring * rows * 4 * t * (tp / 2 + 1);
      st.tp_calls_forward += 2;
    }
  }
  return out;
}

std::string block_ranges(const parallel::PipelinePartition& part, int rank) {
  std::string out;
  for (int s = rank; s < part.stages(); s += part.pp) {
    const int first = part.first_block(s), last = first + part.blocks[s] - 1;
    out += (out.empty() ? "" : ", ") + std::to_string(first) +
           (last == first ? "" : "-" + std::to_string(last));
  }
  return out;
}

}  // namespace

PipelinePrediction predict_pipeline(const modtrain::RunConfig& cfg, const Layout& l,
                                    const Fabric& f) {
  const auto& m = cfg.model();
  const int pp = l.pp, v = l.v, mb = cfg.train().grad_accum();
  modtrain::RunConfig staged = cfg;
  auto* p = staged.mutable_parallel();
  p->set_pp(pp);
  p->set_virtual_stages(v);
  p->set_pp_schedule(v > 1 ? modtrain::ParallelConfig::INTERLEAVED_1F1B
                           : modtrain::ParallelConfig::ONE_F_ONE_B);
  const parallel::PipelinePartition part = parallel::plan_partition(staged);
  const std::vector<Stage> stages = stages_of(cfg, l, part);
  const int n = part.stages();

  PipelinePrediction out;
  out.microbatches = mb;
  const double rows = static_cast<double>(cfg.train().batch_size()) / l.dp;
  // f32, as the runtime sends: [B/dp, T, D], or under sequence parallelism each tp rank's
  // [B/dp, T/tp, D] to the same tp rank of the next stage (parallel/pipeline_runtime.cpp).
  const double activation = rows * m.seq_len() / (l.sp ? l.tp : 1) * m.d_model() * 4.0;
  out.transfer = activation / f.dp_busbw + f.dp_latency;

  // A stage's compute at the achieved rate (backward = 2 x forward) plus its tp collectives,
  // which sit on its critical path.
  parallel::StageCosts costs = parallel::StageCosts::uniform(pp, v, 0, 0);
  costs.transfer = out.transfer;
  const double tokens = rows * m.seq_len();
  for (int s = 0; s < n; ++s) {
    const Stage& st = stages[s];
    const double forward = part.forward_per_token[s] * tokens / l.tp / f.achieved();
    double tp_f = 0, tp_b = 0;
    if (l.tp > 1) {
      tp_f = st.tp_forward / f.tp_busbw + st.tp_calls_forward * f.tp_latency;
      tp_b = st.tp_backward / f.tp_busbw + st.tp_calls_backward * f.tp_latency;
    }
    costs.forward[s % pp][s / pp] = forward + tp_f;
    costs.backward[s % pp][s / pp] = 2 * forward + tp_b;
  }
  const parallel::PipelineSchedule sched = parallel::make_schedule(
      parallel::schedule_kind(staged.parallel()), pp, mb, v);
  const parallel::ScheduleSimulation sim = parallel::simulate_schedule(sched, costs);
  out.schedule = parallel::schedule_name(sched.kind);
  out.bubble_equal = parallel::predicted_bubble(pp, mb, v);
  out.bubble = sim.bubble_fraction();
  out.makespan = sim.makespan;

  const double dp = l.dp;
  const double bucket_cap = std::max(1.0, cfg.parallel().bucket_mb() * 1024.0 * 1024.0);
  for (int r = 0; r < pp; ++r) {
    PipelineRank pr;
    double seq_partial = 0;
    pr.blocks = block_ranges(part, r);
    for (int s = r; s < n; s += pp) {
      const Stage& st = stages[s];
      pr.local += st.split / l.tp + st.replicated;
      pr.tp_bytes += mb * (st.tp_forward + st.tp_backward);
      seq_partial += st.seq_partial;
      pr.p2p_bytes += mb * activation * ((s < n - 1 ? 1 : 0) + (s > 0 ? 1 : 0));
    }
    if (seq_partial > 0) {  // SP: the partial gradients summed over tp once a step
      const double bytes = 2 * (l.tp - 1.0) / l.tp * 4 * seq_partial;
      pr.tp_bytes += bytes;
      pr.tp_step = bytes / f.tp_busbw + f.tp_latency;
    }
    pr.busy = sim.busy[r];
    pr.finish = sim.finish[r];
    pr.state_bytes = state_bytes(pr.local, l);
    if (l.dp > 1) {
      const double grads = 4 * pr.local;
      pr.dp_bytes = 2 * (dp - 1) / dp * grads;
      // Buckets of parallel.bucket_mb, ready evenly through the rank's last backward (chunk 0's
      // last micro-batch in both schedules); an interleaved rank's other chunks are final
      // earlier, so this overstates what is left for them.
      const int buckets = std::max(1, static_cast<int>(std::ceil(grads / bucket_cap)));
      const double window = costs.backward[r][0];
      const double sent = (l.sharded() ? 1.0 : 2.0) * (dp - 1) / dp * grads / buckets;
      std::vector<BucketTime> times;
      for (int k = 0; k < buckets; ++k)
        times.push_back({window * (k + 1) / buckets, sent / f.dp_busbw + f.dp_latency});
      const Overlap o = overlap_buckets(times, window);
      pr.grad_comm = o.comm;
      pr.grad_exposed = o.exposed;
      if (l.sharded()) pr.gather = (dp - 1) / dp * grads / f.dp_busbw + f.dp_latency;
    }
    out.ranks.push_back(pr);
  }
  return out;
}

}  // namespace mod::bench
