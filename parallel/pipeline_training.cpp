// The trainer's pipeline pieces (see pipeline_training.h).
#include "parallel/pipeline_training.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "core/weight_copy.h"
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

void release_other_stages(const model::Transformer& model, const PipelinePartition& part,
                          int pp_rank, bool tie_embeddings) {
  for (const auto& [name, p] : model.named_parameters()) {
    if (stage_owns(part, pp_rank, name, tie_embeddings)) continue;
    Storage& s = *p.impl()->storage;
    if (p.impl()->offset_bytes != 0 || s.bytes() != p.nbytes())
      throw std::logic_error("pp: parameter " + name + " " + describe(p) +
                             " is a view into a larger storage, which releasing would free");
    s.resize(0);
    s.set_label(name + ", another pipeline stage's parameter, not held by pp rank " +
                std::to_string(pp_rank));
    // A bf16 copy a whole-model forward made (evaluation) goes too; the next one remakes it.
    if (WeightCopy* copy = p.impl()->weight_copy.get()) copy->value = Tensor();
  }
}

OtherStagesWhole::OtherStagesWhole(const model::Transformer& model, const PipelinePartition* part,
                                   Communicator& pp, bool tie_embeddings, bool broadcast,
                                   bool keep)
    : model_(model), part_(part), pp_rank_(pp.rank()), tie_(tie_embeddings), keep_(keep) {
  if (!part_) return;
  if (!keep_)
    for (const auto& [name, p] : model.named_parameters())
      if (!stage_owns(*part_, pp_rank_, name, tie_)) p.impl()->storage->resize(p.nbytes());
  if (broadcast) broadcast_stage_parameters(model, *part_, pp);
}

OtherStagesWhole::~OtherStagesWhole() {
  if (part_ && !keep_) release_other_stages(model_, *part_, pp_rank_, tie_);
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
