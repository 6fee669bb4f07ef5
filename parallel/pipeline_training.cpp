// The trainer's pipeline pieces (see pipeline_training.h).
#include "parallel/pipeline_training.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "parallel/pipeline_runtime.h"

namespace mod::parallel {

namespace {
constexpr int kStatsTag = 54;  // apart from run_stage_step's activation and gradient tags
}  // namespace

void sum_tied_embedding_owned_grads(const model::Transformer& model, Communicator* group,
                                    const GradBucketer& buckets) {
  if (!group || !model.config().tie_embeddings()) return;
  for (const auto& [name, p] : model.named_parameters())
    if (name == "embed.weight")
      if (Tensor g = buckets.owned_grad(p); g.defined()) group->all_reduce(g);
}

void broadcast_stage_parameters(const model::Transformer& model, const PipelinePartition& part,
                                Communicator& pp) {
  for (const auto& [name, p] : model.named_parameters()) {
    int owner = 0;
    while (!stage_owns(part, owner, name, /*tie_embeddings=*/false)) ++owner;
    pp.broadcast(p, owner);
  }
}

void gather_stage_stats(std::vector<model::RoutedBlockStats>& routed,
                        std::vector<model::MoeStats>& moe, Communicator& pp) {
  model::resolve_stats(routed);
  model::resolve_moe_stats(moe);
  if (pp.size() == 1) return;
  // Packed as [n_routed, n_moe, per routed block: block, mean, std, accuracy, precision,
  // recall, buckets, fractions..., per MoE layer: block, four fractions].
  if (pp.rank() > 0) {
    std::vector<double> v = {static_cast<double>(routed.size()), static_cast<double>(moe.size())};
    for (const auto& s : routed) {
      v.insert(v.end(), {static_cast<double>(s.block), s.router_mean, s.router_std, s.accuracy,
                         s.precision, s.recall,
                         static_cast<double>(s.routed_fraction_by_bucket.size())});
      v.insert(v.end(), s.routed_fraction_by_bucket.begin(), s.routed_fraction_by_bucket.end());
    }
    for (const auto& s : moe)
      v.insert(v.end(), {static_cast<double>(s.block), s.unrouted_fraction, s.noop_fraction,
                         s.dropped_fraction, s.max_load});
    Tensor size = Tensor::from_vector(std::vector<double>{static_cast<double>(v.size())}, {1}, DType::F64);
    pp.send(size, 0, kStatsTag);
    pp.send(Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, DType::F64), 0, kStatsTag);
    return;
  }
  for (int src = 1; src < pp.size(); ++src) {
    Tensor size = Tensor::empty({1}, DType::F64);
    pp.recv(size, src, kStatsTag);
    Tensor t = Tensor::empty({static_cast<int64_t>(size.at(0))}, DType::F64);
    pp.recv(t, src, kStatsTag);
    const double* d = t.data<double>();
    const int64_t n_routed = static_cast<int64_t>(d[0]), n_moe = static_cast<int64_t>(d[1]);
    d += 2;
    for (int64_t i = 0; i < n_routed; ++i) {
      model::RoutedBlockStats s;
      s.block = static_cast<int>(*d++);
      for (double* x : {&s.router_mean, &s.router_std, &s.accuracy, &s.precision, &s.recall}) *x = *d++;
      const int64_t buckets = static_cast<int64_t>(*d++);
      s.routed_fraction_by_bucket.assign(d, d + buckets);
      d += buckets;
      routed.push_back(std::move(s));
    }
    for (int64_t i = 0; i < n_moe; ++i) {
      model::MoeStats s;
      s.block = static_cast<int>(*d++);
      for (double* x : {&s.unrouted_fraction, &s.noop_fraction, &s.dropped_fraction, &s.max_load}) *x = *d++;
      moe.push_back(std::move(s));
    }
  }
  // Interleaved, a rank's blocks are not one range (rank 0 holds virtual stages 0, pp, ...).
  auto by_block = [](const auto& a, const auto& b) { return a.block < b.block; };
  std::stable_sort(routed.begin(), routed.end(), by_block);
  std::stable_sort(moe.begin(), moe.end(), by_block);
}

}  // namespace mod::parallel
