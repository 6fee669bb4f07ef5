// parallel_bench's predicted step time on a real cluster (--napkin-only --fabric): compute from
// the model's training FLOPs at an assumed share of the device's peak, communication from the
// napkin bytes at an assumed bus bandwidth plus a latency per collective, and the data-parallel
// gradient buckets overlapped with the last micro-batch's backward. Predictions, not
// measurements; docs/parallel.md "On a real cluster" states every assumption.
//
// Bandwidths follow NCCL's "busbw" convention (nccl-tests PERFORMANCE.md): an all-reduce of S
// bytes over n ranks takes 2(n-1)/n x S / busbw, an all-gather, reduce-scatter or all-to-all
// (n-1)/n x S / busbw, i.e. exactly the bytes per rank the napkin counts, divided by busbw.
#pragma once

#include <string>
#include <vector>

#include "benchmarks/parallel/parallel_napkin.h"
#include "configs/modtrain.pb.h"

namespace mod::bench {

// What the prediction assumes about the machine. A preset (--fabric) fills every field; each
// option overrides one.
struct Fabric {
  std::string name;       // "nvlink-h100", "ib-400g"
  double dp_busbw = 0;    // B/s per rank over the dp (and edp, ep) groups, e.g. 40e9
  double tp_busbw = 0;    // B/s per rank over the tp group (inside a node), e.g. 360e9
  double dp_latency = 0;  // seconds per dp / edp / ep collective, e.g. 30e-6
  double tp_latency = 0;  // seconds per tp collective, e.g. 10e-6
  double peak_flops = 0;  // per rank, e.g. 989e12 (H100 SXM, dense bf16)
  double mfu = 0;         // share of the peak the compute achieves, e.g. 0.4
  double achieved() const { return peak_flops * mfu; }
  std::string describe() const;  // every number above, in the units of the options
};
// "nvlink-h100" (8 H100 in one NVLink/NVSwitch node) or "ib-400g" (one 400 Gb/s InfiniBand NIC
// per GPU between nodes, NVLink inside); anything else is an error listing the presets.
Fabric fabric_preset(const std::string& name);
std::vector<std::string> fabric_names();

// Training state on one GPU holding `local` dense parameters: f32 parameters, gradients and AdamW
// moments (16 B each), the moments sharded over dp by ZeRO-1, the gradients too by ZeRO-2, all
// of it by ZeRO-3. Activations (and ZeRO-3's gathered units) are not counted.
double state_bytes(double local, const Layout& l);

// One collective on the comm stream: when backward makes its data final (seconds from the start
// of the step's last backward) and how long it takes once started.
struct BucketTime {
  double ready = 0, transfer = 0;
};
struct Overlap {
  double comm = 0;     // sum of the transfers: what no overlap exposes
  double end = 0;      // when the last transfer ends, from the start of backward
  double exposed = 0;  // max(0, end - backward): what the step waits for after backward
};
// The overlap schedule of parallel/data_parallel.h: buckets start strictly in index order, each
// when it is ready and the previous transfer has ended, one at a time. Throws on a negative
// time or a bucket ready after backward ends.
Overlap overlap_buckets(const std::vector<BucketTime>& buckets, double backward);

// One gradient bucket of cfg under l on a rank, as GradBucketer packs it: parameters in reverse
// registration order (model/parameter_shapes.h), f32 gradients of the tp-local (or ep-local)
// shapes, closed once it holds parallel.bucket_mb MiB; dense over dp, experts over edp.
struct GradBucket {
  double bytes = 0;           // S: the bucket's gradient bytes on the rank
  int ranks = 1;              // n of the group it is reduced over (dp or edp)
  double ready_fraction = 0;  // share of backward done when its last gradient is final
  int params = 0;             // parameters in it
  bool expert = false;        // expert weights (over edp) rather than dense ones (over dp)
  bool reduce_scatter = false;  // ZeRO-1: reduce-scattered, (n-1)/n x S; else all-reduced
  // Bytes the rank sends for it (NCCL's bus-bandwidth convention).
  double sent() const { return (reduce_scatter ? 1.0 : 2.0) * (ranks - 1) / ranks * bytes; }
};
// Dense buckets then expert buckets, each list in launch order; none for a group of one.
// Backward runs the LM head, then the blocks from last to first, then the embedding, each for a
// time in proportion to its forward FLOPs (model/flops.h); a bucket is ready when the block
// holding its earliest-registered parameter is done (block granularity).
std::vector<GradBucket> grad_buckets(const modtrain::RunConfig& cfg, const Layout& l);

// Per step and rank, in seconds.
struct StepTime {
  double compute = 0;        // training FLOPs / (dp x tp) / achieved FLOP/s, all micro-batches
  double last_backward = 0;  // the last micro-batch's backward (2/3 of its compute)
  int buckets = 0;           // gradient all-reduces (dense and expert)
  double grad_comm = 0;      // their transfers and latencies: the overlappable part
  double gather = 0;         // ZeRO-1's all-gather of updated parameters (after the optimizer)
  double tp = 0, ep = 0;     // on the critical path inside forward and backward
  int tp_calls = 0, ep_calls = 0;
  double exposed_grad = 0;  // the buckets' transfer left after backward ends, with overlap
  // The ZeRO all-gathers' share of the step with overlap: ZeRO-1/2's after the optimizer is
  // all of `gather`; ZeRO-3's per-unit gathers stall compute only where prefetch falls behind.
  double exposed_gather = 0;
  double exposed_dp_no_prefetch = 0;  // ZeRO-3: dp's exposed time, each unit gathered when needed
  double comm() const { return grad_comm + gather + tp + ep; }
  double exposed(bool overlap) const {
    return (overlap ? exposed_grad + exposed_gather : grad_comm + gather) + tp + ep;
  }
  double step(bool overlap) const { return compute + exposed(overlap); }
};
// ZeRO-3's step on one comm stream (parallel/zero3.h): each micro-batch gathers the outer unit
// (blocking), then block b before it runs (with prefetch issued when block b - 1 starts, block
// 0 when the outer unit is in), computes the head, and in backward gathers block b again before
// its backward (with prefetch issued when block b + 1's backward starts); the last micro-batch
// reduce-scatters each unit when its backward ends (the outer unit after the embedding's).
// Collectives run one at a time in the order issued; a unit's transfer is (dp - 1)/dp x 4 B x
// its parameters / busbw + latency. Block b's forward is its share of the forward FLOPs and
// its backward twice that, scaled so that the step's compute is `compute`.
struct Zero3Time {
  double gather = 0, reduce = 0;  // all transfers: all-gathers, reduce-scatters
  double stalls = 0;              // compute waiting for a gather
  double tail = 0;                // reduce-scatters left after the last backward ends
};
Zero3Time zero3_step(const modtrain::RunConfig& cfg, const Layout& l, const Fabric& f,
                     double compute, bool prefetch);

StepTime predict_step(const modtrain::RunConfig& cfg, const Layout& l, const Napkin& nk,
                      const Fabric& f);

}  // namespace mod::bench
