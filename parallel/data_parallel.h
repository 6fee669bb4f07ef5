// Data-parallel gradient averaging in buckets, overlapped with backward. Parameters are packed
// into buckets of about bucket_mb in reverse registration order (the order backward finishes
// them); a bucket's collective starts as soon as its last gradient is final, while backward
// goes on. Buckets start strictly in index order, so every dp rank issues the same sequence of
// collectives.
//
// Two ways to reduce a bucket:
// - AllReduce (plain dp): the bucket is the members' gradients end to end, all-reduced; every
//   rank gets every averaged gradient.
// - ReduceScatter (ZeRO-1, as Megatron's distributed optimizer and DeepSpeed): each rank needs
//   only the slice of each gradient it updates (zero1_owned, zero1.h), so the bucket is packed
//   rank-major, [dp x L]: for r in 0..dp-1, for each member, its r-th chunk zero-padded to
//   chunk = ceil(numel / dp); L = the members' chunks summed. reduce_scatter_async hands rank r
//   block r summed. Half an all-reduce's bytes; finish() writes the averages into the owned
//   slice of each gradient only; the rest of the gradient stays this rank's own, unreduced.
// - ReduceScatter with release_grads (ZeRO-2): as ReduceScatter, but each member's full
//   gradient is dropped as soon as its bucket is packed, the packed buffer as soon as its
//   reduce-scatter completes (a bucket waits for the one before it first, so one is in flight),
//   and the averages stay in the bucket's shard: owned_grad() is where the optimizer and the
//   clipping norm read them. A rank then holds only its owned slices after backward, plus one
//   bucket while it fills and one in flight.
// Either reduce-scatter reads the owned averages through owned_grad().
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "parallel/communicator.h"

namespace mod::parallel {

enum class GradReduce { AllReduce, ReduceScatter };

class GradBucketer {
 public:
  // Sums gradients over `group` and divides by average_over (0: the group's size). Expert
  // weights sum over their expert data-parallel group and divide by dp, since the all-to-all
  // already summed the other ep ranks' tokens into them. `reduce`: see the top of this file.
  // unit_of (ZeRO-3), one entry per parameter: a bucket closes where the unit changes (in
  // reverse registration order) and nowhere else, so a block's gradients reduce-scatter as soon
  // as its backward is done; bucket_mb is then unused. Empty: buckets of about bucket_mb.
  GradBucketer(std::vector<std::pair<std::string, Tensor>> params, Communicator& group,
               double bucket_mb, int average_over = 0,
               GradReduce reduce = GradReduce::AllReduce, bool release_grads = false,
               const std::vector<int>& unit_of = {});
  ~GradBucketer();

  // Pass to backward() on the micro-batch that ends the step (earlier micro-batches only
  // accumulate locally, as with DDP's no_sync).
  LeafGradReady ready_hook();
  // Starts what is left, waits for every bucket, and leaves each gradient (ReduceScatter: this
  // rank's owned slice of it) summed over the group and divided by average_over.
  // A parameter that got no gradient this step contributes zeros.
  void finish();

  // ReduceScatter, after finish(): this rank's owned slice (zero1_owned) of param's averaged
  // gradient, flattened [end - begin], a view of its bucket's shard; valid until the next
  // step's backward reaches the bucket. Undefined for an empty slice or a parameter not here.
  Tensor owned_grad(const Tensor& param) const;

  size_t num_buckets() const { return buckets_.size(); }
  // Bytes this rank handed to its collectives so far (for the benchmarks).
  int64_t bytes_reduced() const { return bytes_reduced_; }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    Tensor flat;                  // AllReduce: [sum of numel]; ReduceScatter: [dp x L], padded
                                  // (release_grads: only from packing to the reduce's end)
    Tensor shard;                 // ReduceScatter: [L], this rank's block of flat, reduced
    int pending = 0;              // members whose gradient is not final yet
    std::unique_ptr<Work> work;
  };
  void launch_ready();
  void launch(Bucket& b);
  void pack_rank_major(Bucket& b);   // ReduceScatter's layout of flat
  void unpack_owned(Bucket& b);      // shard's averages into the owned gradient slices
  void drain(Bucket& b);             // waits for b's collective; release_grads: drops b.flat

  std::vector<std::pair<std::string, Tensor>> params_;
  std::unordered_map<TensorImpl*, size_t> index_;  // parameter -> its position in params_
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<int64_t> shard_at_;  // ReduceScatter: per parameter, its chunk's offset in shard
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  Communicator& dp_;
  double inv_average_;
  GradReduce reduce_;
  bool release_grads_;
  int64_t bytes_reduced_ = 0;
};

}  // namespace mod::parallel
