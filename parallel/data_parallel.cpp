// Bucketed, overlapped gradient all-reduce or reduce-scatter (see data_parallel.h).
#include "parallel/data_parallel.h"

#include <stdexcept>

#include "core/backend.h"
#include "parallel/zero1.h"

namespace mod::parallel {

GradBucketer::GradBucketer(std::vector<std::pair<std::string, Tensor>> params, Communicator& group,
                           double bucket_mb, int average_over, GradReduce reduce,
                           bool release_grads, const std::vector<int>& unit_of)
    : params_(std::move(params)), bucket_of_(params_.size()), shard_at_(params_.size(), 0),
      dp_(group), inv_average_(1.0 / (average_over > 0 ? average_over : group.size())),
      reduce_(reduce), release_grads_(release_grads) {
  if (release_grads && reduce != GradReduce::ReduceScatter)
    throw std::logic_error("GradBucketer: release_grads needs GradReduce::ReduceScatter (the "
                           "owned slices must live somewhere once the full gradients are gone)");
  if (!unit_of.empty() && unit_of.size() != params_.size())
    throw std::logic_error("GradBucketer: " + std::to_string(unit_of.size()) + " units for " +
                           std::to_string(params_.size()) + " parameters");
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1024 * 1024));
  int64_t filled = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k].second;
    if (buckets_.empty() || (unit_of.empty() ? filled >= cap : unit_of[k] != unit_of[k + 1])) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().members.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    filled += static_cast<int64_t>(p.nbytes());
  }
  for (size_t k = 0; k < params_.size(); ++k) index_[params_[k].second.impl()] = k;
  for (Bucket& b : buckets_) {
    const Tensor& first = params_[b.members.front()].second;
    b.pending = static_cast<int>(b.members.size());
    if (reduce_ == GradReduce::ReduceScatter) {
      int64_t len = 0;  // L
      for (size_t k : b.members) {
        shard_at_[k] = len;
        len += zero1_chunk(params_[k].second.numel(), dp_.size());
      }
      // Zeroed once: the padding past each gradient's last chunk is never written.
      if (!release_grads_)
        b.flat = Tensor::zeros({dp_.size() * len}, first.dtype(), first.device());
      b.shard = Tensor::empty({len}, first.dtype(), first.device());
      continue;
    }
    int64_t n = 0;
    for (size_t k : b.members) n += params_[k].second.numel();
    b.flat = Tensor::empty({n}, first.dtype(), first.device());
  }
}

GradBucketer::~GradBucketer() {
  for (Bucket& b : buckets_)
    if (b.work) b.work->wait();
}

LeafGradReady GradBucketer::ready_hook() {
  return [this](const Tensor& leaf) {
    auto it = index_.find(leaf.impl());
    if (it == index_.end()) return;
    --buckets_[bucket_of_[it->second]].pending;
    launch_ready();
    // Drive the buckets in flight while backward computes: MPI progresses them only in calls.
    for (size_t b = 0; b < next_launch_; ++b)
      if (buckets_[b].work) buckets_[b].work->test();
  };
}

void GradBucketer::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    // One bucket in flight under release_grads: the one before gives its buffer back first.
    if (release_grads_ && next_launch_ > 0) drain(buckets_[next_launch_ - 1]);
    launch(buckets_[next_launch_++]);
  }
}

void GradBucketer::drain(Bucket& b) {
  if (b.work) b.work->wait();
  b.work.reset();  // a communicator's Work holds the buffers it reads
  if (release_grads_) b.flat = Tensor();
}

void GradBucketer::launch(Bucket& b) {
  if (reduce_ == GradReduce::ReduceScatter) {
    if (release_grads_)  // zeros: the padding past each gradient's last chunk
      b.flat = Tensor::zeros({dp_.size() * b.shard.numel()}, b.shard.dtype(), b.shard.device());
    pack_rank_major(b);
    if (release_grads_)
      for (size_t k : b.members) params_[k].second.impl()->grad = Tensor();
    bytes_reduced_ += static_cast<int64_t>(b.flat.nbytes());
    b.work = dp_.reduce_scatter_async(b.flat, b.shard);
    return;
  }
  int64_t at = 0;
  for (size_t k : b.members) {
    const Tensor& p = params_[k].second;
    Tensor dst = b.flat.narrow0(at, p.numel());
    if (p.grad().defined())
      dst.copy_from(p.grad());
    else
      backend_of(dst).fill(dst, 0.0);
    at += p.numel();
  }
  bytes_reduced_ += static_cast<int64_t>(b.flat.nbytes());
  b.work = dp_.all_reduce_async(b.flat);
}

// Block r of flat: chunk r of each member in turn, each padded to its chunk length.
void GradBucketer::pack_rank_major(Bucket& b) {
  const int64_t len = b.shard.numel();
  for (int r = 0; r < dp_.size(); ++r) {
    int64_t at = r * len;
    for (size_t k : b.members) {
      const Tensor& p = params_[k].second;
      const int64_t n = p.numel(), c = zero1_chunk(n, dp_.size());
      const auto [begin, end] = zero1_owned(n, r, dp_.size());
      if (end > begin) {
        Tensor dst = b.flat.narrow0(at, end - begin);
        if (p.grad().defined())
          dst.copy_from(p.grad().view({n}).narrow0(begin, end - begin));
        else
          backend_of(dst).fill(dst, 0.0);
      }
      at += c;
    }
  }
}

void GradBucketer::unpack_owned(Bucket& b) {
  backend_of(b.shard).scale(b.shard, inv_average_, b.shard);
  int64_t at = 0;
  for (size_t k : b.members) {
    const Tensor& p = params_[k].second;
    const int64_t n = p.numel();
    const auto [begin, end] = zero1_owned(n, dp_.rank(), dp_.size());
    if (!p.grad().defined()) p.impl()->grad = Tensor::zeros(p.shape(), p.dtype(), p.device());
    if (end > begin) {
      Tensor mine = p.grad().view({n}).narrow0(begin, end - begin);
      mine.copy_from(b.shard.narrow0(at, end - begin));
    }
    at += zero1_chunk(n, dp_.size());
  }
}

void GradBucketer::finish() {
  for (Bucket& b : buckets_) b.pending = 0;  // whatever was not final is final now
  launch_ready();
  const double inv = inv_average_;
  for (Bucket& b : buckets_) {
    drain(b);
    if (reduce_ == GradReduce::ReduceScatter) {
      if (release_grads_)  // the averages stay in the shard (owned_grad)
        backend_of(b.shard).scale(b.shard, inv, b.shard);
      else
        unpack_owned(b);
      b.pending = static_cast<int>(b.members.size());
      continue;
    }
    backend_of(b.flat).scale(b.flat, inv, b.flat);
    int64_t at = 0;
    for (size_t k : b.members) {
      const Tensor& p = params_[k].second;
      const Tensor avg = b.flat.narrow0(at, p.numel()).view(p.shape());
      if (p.grad().defined()) {
        Tensor g = p.grad();
        g.copy_from(avg);
      } else {
        p.impl()->grad = avg.clone();
      }
      at += p.numel();
    }
    b.pending = static_cast<int>(b.members.size());
  }
  next_launch_ = 0;
}

Tensor GradBucketer::owned_grad(const Tensor& param) const {
  if (reduce_ != GradReduce::ReduceScatter)
    throw std::logic_error("GradBucketer::owned_grad: only a reduce-scatter has owned slices");
  const auto it = index_.find(param.impl());
  if (it == index_.end()) return Tensor();
  const size_t k = it->second;
  const auto [begin, end] = zero1_owned(param.numel(), dp_.rank(), dp_.size());
  if (end <= begin) return Tensor();
  return buckets_[bucket_of_[k]].shard.narrow0(shard_at_[k], end - begin);
}

}  // namespace mod::parallel
