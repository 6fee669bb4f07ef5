// Predicted step time of a layout on an assumed cluster (see parallel_step_time.h).
#include "benchmarks/parallel/parallel_step_time.h"

#include <algorithm>
#include <stdexcept>

#include "model/flops.h"
#include "model/parameter_shapes.h"
#include "model/routing_schedule.h"

namespace mod::bench {

namespace {

// The presets. Bus bandwidths are what NCCL all-reduce reaches on large messages: 8 H100 SXM
// over NVLink 4 / NVSwitch (450 GB/s per direction) about 360-450 GB/s; one 400 Gb/s NIC per GPU
// (50 GB/s raw) about 40-45 GB/s between nodes. The lower ends are taken.
const Fabric kFabrics[] = {
    {"nvlink-h100", 360e9, 360e9, 10e-6, 10e-6, 989e12, 0.4},
    {"ib-400g", 40e9, 360e9, 30e-6, 10e-6, 989e12, 0.4},
};

}  // namespace

double state_bytes(double local, const Layout& l) {
  const double dp = l.dp;
  switch (l.zero_stage) {
    case 0: return 16 * local;
    case 1: return (4 + 4 + 8 / dp) * local;
    case 2: return (4 + 4 / dp + 8 / dp) * local;
    default: return 16 / dp * local;  // stage 3 (the gathered units not counted)
  }
}

std::string Fabric::describe() const {
  return name +
         fmt(": dp busbw %.0f GB/s, tp busbw %.0f GB/s, latency %.0f us (dp) / %.0f us (tp) per "
             "collective; ",
             dp_busbw / 1e9, tp_busbw / 1e9, dp_latency * 1e6, tp_latency * 1e6) +
         fmt("%.0f TFLOP/s x MFU %.2f = %.1f TFLOP/s per rank", peak_flops / 1e12, mfu,
             achieved() / 1e12);
}

std::vector<std::string> fabric_names() {
  std::vector<std::string> out;
  for (const Fabric& f : kFabrics) out.push_back(f.name);
  return out;
}

Fabric fabric_preset(const std::string& name) {
  std::string known;
  for (const Fabric& f : kFabrics) {
    if (f.name == name) return f;
    known += (known.empty() ? "" : ", ") + f.name;
  }
  throw std::invalid_argument("--fabric '" + name + "': expected one of " + known);
}

Overlap overlap_buckets(const std::vector<BucketTime>& buckets, double backward) {
  if (backward < 0) throw std::invalid_argument(fmt("overlap: backward %g s < 0", backward));
  Overlap o;
  double free_at = 0;  // when the comm stream finishes the previous transfer
  for (const BucketTime& b : buckets) {
    if (b.ready < 0 || b.transfer < 0 || b.ready > backward * (1 + 1e-12))
      throw std::invalid_argument(fmt("overlap: a bucket ready at %g s taking %g s, backward %g s",
                                      b.ready, b.transfer, backward));
    free_at = std::max(free_at, b.ready) + b.transfer;
    o.comm += b.transfer;
  }
  o.end = free_at;
  o.exposed = std::max(0.0, free_at - backward);
  return o;
}

std::vector<GradBucket> grad_buckets(const modtrain::RunConfig& cfg, const Layout& l) {
  const auto& m = cfg.model();
  const model::FlopCount flops = model::count_flops(m);
  // Backward done when block b's gradients are final: the LM head and blocks L-1 .. b.
  std::vector<double> done(m.n_layers() + 1, 0);
  done[m.n_layers()] = flops.lm_head_per_token;
  for (int b = m.n_layers() - 1; b >= 0; --b)
    done[b] = done[b + 1] + flops.blocks[b].forward_per_token;
  const double total = flops.forward_per_token;

  const int edp = l.dp / l.ep * l.tp;
  const double cap = static_cast<double>(
      std::max<int64_t>(1, static_cast<int64_t>(cfg.parallel().bucket_mb() * 1024 * 1024)));
  std::vector<GradBucket> dense, expert;
  double dense_filled = 0, expert_filled = 0;
  const auto shapes = model::parameter_shapes(m);
  for (auto it = shapes.rbegin(); it != shapes.rend(); ++it) {  // GradBucketer's order
    const std::string& name = it->first;
    double numel = 1;
    for (int64_t s : it->second) numel *= static_cast<double>(s);
    const bool is_expert = name.find(".mlp.experts.") != std::string::npos;
    const double bytes = 4 * numel / (is_expert ? l.ep : tp_split_parameter(name) ? l.tp : 1);
    const int blk = block_of_parameter(name);
    const double ready = name == "embed.weight" ? 1.0
                         : blk >= 0             ? done[blk] / total
                                                : done[m.n_layers()] / total;
    auto& list = is_expert ? expert : dense;
    double& filled = is_expert ? expert_filled : dense_filled;
    if (list.empty() || filled >= cap) {
      list.push_back({0, is_expert ? edp : l.dp, 0, 0, is_expert, l.sharded()});
      filled = 0;
    }
    list.back().bytes += bytes;
    list.back().ready_fraction = std::max(list.back().ready_fraction, ready);
    ++list.back().params;
    filled += bytes;
  }
  std::vector<GradBucket> out;
  if (l.dp > 1) out = dense;
  if (edp > 1) out.insert(out.end(), expert.begin(), expert.end());
  return out;
}

Zero3Time zero3_step(const modtrain::RunConfig& cfg, const Layout& l, const Fabric& f,
                     double compute, bool prefetch) {
  const auto& m = cfg.model();
  const int blocks = m.n_layers();
  const int a = cfg.train().grad_accum();
  // Parameters per unit: 0 the outer one, 1 + b block b.
  std::vector<double> params(1 + blocks, 0);
  for (const auto& [name, shape] : model::parameter_shapes(m)) {
    double numel = 1;
    for (int64_t x : shape) numel *= static_cast<double>(x);
    params[1 + block_of_parameter(name)] += numel;
  }
  std::vector<double> transfer(params.size());
  for (size_t u = 0; u < params.size(); ++u)
    transfer[u] = (l.dp - 1.0) / l.dp * 4 * params[u] / f.dp_busbw + f.dp_latency;
  const model::FlopCount flops = model::count_flops(m);
  // One micro-batch's forward seconds per block and for the head (the embedding is a lookup).
  const double scale = compute / a / (3 * flops.forward_per_token);
  std::vector<double> fwd(blocks);
  for (int b = 0; b < blocks; ++b) fwd[b] = flops.blocks[b].forward_per_token * scale;
  const double head = (flops.forward_per_token - [&] {
                        double sum = 0;
                        for (int b = 0; b < blocks; ++b) sum += flops.blocks[b].forward_per_token;
                        return sum;
                      }()) * scale;

  Zero3Time z;
  double t = 0, comm_free = 0;  // the compute and comm streams' clocks
  auto issue = [&](size_t u, bool reduce) {
    comm_free = std::max(comm_free, t) + transfer[u];
    (reduce ? z.reduce : z.gather) += transfer[u];
    return comm_free;
  };
  auto wait = [&](double done) {
    z.stalls += std::max(0.0, done - t);
    t = std::max(t, done);
  };
  std::vector<double> ready(1 + blocks, 0);  // when each unit's gather ends
  for (int micro = 0; micro < a; ++micro) {
    const bool last = micro + 1 == a;
    wait(issue(0, false));
    if (prefetch) ready[1] = issue(1, false);
    for (int b = 0; b < blocks; ++b) {
      if (!prefetch) ready[1 + b] = issue(1 + b, false);
      wait(ready[1 + b]);
      if (prefetch && b + 1 < blocks) ready[2 + b] = issue(2 + b, false);
      t += fwd[b];
    }
    t += 3 * head;  // its forward and backward: the outer unit stays whole
    for (int b = blocks - 1; b >= 0; --b) {
      if (!prefetch || b == blocks - 1) ready[1 + b] = issue(1 + b, false);
      wait(ready[1 + b]);
      if (prefetch && b > 0) ready[b] = issue(b, false);
      t += 2 * fwd[b];
      if (last) issue(1 + b, true);
    }
    if (last) issue(0, true);
  }
  z.tail = std::max(0.0, comm_free - t);
  return z;
}

StepTime predict_step(const modtrain::RunConfig& cfg, const Layout& l, const Napkin& nk,
                      const Fabric& f) {
  const auto& m = cfg.model();
  const double a = cfg.train().grad_accum();
  const double tokens = static_cast<double>(cfg.train().batch_size()) * a * m.seq_len();
  StepTime s;
  s.compute = model::count_flops(m).training_per_token * tokens / (l.dp * l.tp) / f.achieved();
  s.last_backward = s.compute * 2 / 3 / a;  // forward : backward = 1 : 2

  // Gradient buckets: dense and expert ones on one comm stream, in the order they become ready.
  std::vector<GradBucket> buckets = grad_buckets(cfg, l);
  std::stable_sort(buckets.begin(), buckets.end(), [](const GradBucket& x, const GradBucket& y) {
    return x.ready_fraction < y.ready_fraction;
  });
  std::vector<BucketTime> times;
  for (const GradBucket& b : buckets)
    times.push_back({b.ready_fraction * s.last_backward, b.sent() / f.dp_busbw + f.dp_latency});
  const Overlap o = overlap_buckets(times, s.last_backward);
  s.buckets = static_cast<int>(buckets.size());
  s.grad_comm = o.comm;
  s.exposed_grad = o.exposed;

  // ZeRO-1: after the buckets' reduce-scatter, one all-gather of the updated parameters per
  // sharded optimizer (dense over dp, experts over edp), as many bytes (the napkin counts both:
  // 2 (n-1)/n).
  if (l.sharded() && !l.stage3()) {
    s.gather = (nk.dp_bytes + nk.edp_bytes) / 2 / f.dp_busbw;
    s.gather += ((l.dp > 1 ? 1 : 0) + (nk.expert > 0 && nk.edp > 1 ? 1 : 0)) * f.dp_latency;
    s.exposed_gather = s.gather;
  }
  // ZeRO-3: per-unit gathers and reduce-scatters on one stream beside the compute (zero3_step);
  // its buckets are the units, not parallel.bucket_mb's.
  if (l.stage3() && l.dp > 1) {
    const Zero3Time with = zero3_step(cfg, l, f, s.compute, true);
    const Zero3Time without = zero3_step(cfg, l, f, s.compute, false);
    s.buckets = cfg.model().n_layers() + 1;
    s.grad_comm = with.reduce;
    s.exposed_grad = with.tail;
    s.gather = with.gather;
    s.exposed_gather = with.stalls;
    s.exposed_dp_no_prefetch = without.stalls + without.tail;
  }
  // tp: per micro-batch 4 collectives per block (parallel_napkin.cpp), 2 for the embedding and
  // the LM head's input, 2 in the vocabulary-parallel cross-entropy; once a step the gradient
  // norm.
  // Sequence parallelism sends the same bytes in twice the calls (an all-gather and a
  // reduce-scatter for each all-reduce but the cross-entropy's 2), plus per routed block the
  // scores' and predictor logits' all-gathers, the rows' all-reduce each way and the causal
  // loss's, and once a step the partial gradients' all-reduce.
  if (l.tp > 1) {
    int routed = 0;
    for (bool r : model::routed_blocks(m)) routed += r;
    s.tp_calls = l.sp ? static_cast<int>(a) * (8 * m.n_layers() + 6 + 5 * routed) + 2
                      : static_cast<int>(a) * (4 * m.n_layers() + 4) + 1;
    s.tp = nk.tp_bytes / f.tp_busbw + s.tp_calls * f.tp_latency;
  }
  // ep: 4 all-to-alls per MoE block per micro-batch, across the dp fabric.
  if (l.ep > 1) {
    int n_moe = 0;
    for (bool x : model::moe_blocks(m)) n_moe += x;
    s.ep_calls = static_cast<int>(a) * 4 * n_moe;
    s.ep = nk.ep_bytes / f.dp_busbw + s.ep_calls * f.dp_latency;
  }
  return s;
}

}  // namespace mod::bench
