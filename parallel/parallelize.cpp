// Tensor, expert and data parallelism and the optimizer applied to a built model (see
// parallelize.h).
#include "parallel/parallelize.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "configs/config.h"
#include "core/all_ops.h"
#include "core/nn/module.h"
#include "model/parameter_roles.h"
#include "parallel/adamw.h"
#include "parallel/expert_parallel.h"
#include "parallel/tp_mappings.h"
#include "parallel/vocab_parallel.h"
#include "parallel/zero1.h"

namespace mod::parallel {

namespace {
// copy_to_tp once per input tensor: wq, wk and wv (and mlp up and gate) read the same tensor,
// so they share one copy node and backward all-reduces their summed input gradient once. Under
// sequence parallelism the mapping is gather_seq_from_tp: one all-gather, one reduce-scatter.
class SharedCopyToTp {
 public:
  using Mapping = Tensor (*)(const Tensor&, Communicator&);
  explicit SharedCopyToTp(Communicator& tp, Mapping map = copy_to_tp) : tp_(tp), map_(map) {}
  void add_consumer() { ++consumers_; }
  Tensor operator()(const Tensor& x) {
    if (!(last_out_.defined() && last_in_.lock() == x.impl_ptr())) {
      last_out_ = map_(x, tp_);
      last_in_ = x.impl_ptr();
      uses_ = 0;
    }
    // The copy is held from the first consumer to the last, since they keep only views of it
    // (or their casts) and it would otherwise die between wq and wk; then it is let go, so the
    // block's input is not kept past its backward, nor through a recomputed block's forward.
    Tensor out = last_out_;
    if (++uses_ >= consumers_) last_out_ = Tensor();
    return out;
  }

 private:
  Communicator& tp_;
  Mapping map_;
  int consumers_ = 0, uses_ = 0;
  std::weak_ptr<TensorImpl> last_in_;  // watched weakly: a new input starts a new copy
  Tensor last_out_;
};

struct Sharder {
  model::Transformer& model;
  Communicator& tp;
  ShardMap specs;

  std::shared_ptr<nn::Linear> linear(const std::string& path) {
    auto m = std::dynamic_pointer_cast<nn::Linear>(model.find_module(path));
    if (!m) throw std::logic_error("parallelize: no linear layer at " + path);
    return m;
  }
  Tensor shard(const std::string& name, const Tensor& full, int dim) {
    const int64_t len = full.size(dim) / tp.size(), offset = tp.rank() * len;
    specs[name] = {dim, full.shape(), offset};
    return slice_dim(full, dim, offset, len);
  }
  void column(const std::string& path, const std::shared_ptr<SharedCopyToTp>& copy) {
    auto l = linear(path);
    copy->add_consumer();
    Tensor w = shard(path + ".weight", l->weight(), 0);
    Tensor b = l->bias().defined() ? shard(path + ".bias", l->bias(), 0) : Tensor();
    l->shard(w, b, [copy](const Tensor& x) { return (*copy)(x); }, nullptr);
  }
  void row(const std::string& path, bool split_sequence = false) {
    auto l = linear(path);
    Tensor w = shard(path + ".weight", l->weight(), 1);
    Communicator* c = &tp;
    if (split_sequence)
      l->shard(w, l->bias(), nullptr,
               [c](const Tensor& y) { return reduce_scatter_seq_to_tp(y, *c); });
    else
      l->shard(w, l->bias(), nullptr, [c](const Tensor& y) { return reduce_from_tp(y, *c); });
  }
};
}  // namespace

Tensor slice_dim(const Tensor& t, int dim, int64_t offset, int64_t len) {
  if (dim < 0 || dim >= t.dim() || offset < 0 || offset + len > t.size(dim))
    throw std::invalid_argument("slice_dim: [" + std::to_string(offset) + ", +" +
                                std::to_string(len) + ") along dim " + std::to_string(dim) +
                                " of " + describe(t));
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= t.size(i);
  for (int64_t i = dim + 1; i < t.dim(); ++i) inner *= t.size(i);
  Shape shape = t.shape();
  shape[dim] = len;
  Tensor out = Tensor::empty(shape, t.dtype(), t.device());
  const size_t es = dtype_size(t.dtype()), chunk = len * inner * es;
  const char* src = static_cast<const char*>(t.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + o * chunk, src + (o * t.size(dim) + offset) * inner * es, chunk);
  return out;
}

ShardMap parallelize_tensor(model::Transformer& model, const Mesh& mesh, bool sequence_parallel) {
  mesh.dims().validate_model(model.config());
  Sharder s{model, mesh.tp(), {}};
  for (const auto& [name, p] : model.named_parameters()) s.specs[name] = {-1, p.shape(), 0};
  if (mesh.tp().size() == 1) return s.specs;

  const auto& cfg = model.config();
  const bool sp = sequence_parallel;
  // The mapping in front of column-parallel layers that read the (split or replicated) stream.
  const SharedCopyToTp::Mapping stream_in = sp ? gather_seq_from_tp : copy_to_tp;
  for (int b = 0; b < cfg.n_layers(); ++b) {
    const std::string blk = "blocks." + std::to_string(b) + ".";
    // A routed block runs on its gathered [B,C,D] rows, replicated as under plain TP.
    const bool split = sp && !model.routed(b);
    auto attn_in = std::make_shared<SharedCopyToTp>(mesh.tp(), split ? stream_in : copy_to_tp);
    for (const char* w : {"wq", "wk", "wv"}) s.column(blk + "attn." + w, attn_in);
    s.row(blk + "attn.wo", split);
    if (model::MoeMlp* moe = model.moe(b)) {  // experts: parallelize_experts
      // On the split stream the MoE layer runs on the gathered sequence exactly as under plain
      // TP (whole, identical on every rank), then keeps its positions (tp_mappings.h).
      Communicator* c = &mesh.tp();
      if (split)
        moe->set_sequence_gather({[c](const Tensor& x) { return gather_seq_whole_from_tp(x, *c); },
                                  [c](const Tensor& y) { return split_seq_to_tp(y, *c); }});
      continue;
    }
    auto mlp_in = std::make_shared<SharedCopyToTp>(mesh.tp(), split ? stream_in : copy_to_tp);
    s.column(blk + "mlp.up", mlp_in);
    if (cfg.mlp() == modtrain::ModelConfig::SWIGLU) s.column(blk + "mlp.gate", mlp_in);
    s.row(blk + "mlp.down", split);
  }

  Communicator* tp = &mesh.tp();
  auto embed = std::dynamic_pointer_cast<nn::Embedding>(model.find_module("embed"));
  Tensor table = s.shard("embed.weight", embed->weight(), 0);
  const int64_t vocab_start = s.specs["embed.weight"].offset;
  // Sequence parallelism gathers the sequence before the head: the vocabulary-parallel loss
  // then runs on every position as under plain TP.
  auto head_in = std::make_shared<SharedCopyToTp>(mesh.tp(), stream_in);
  embed->shard(
      table,
      [tp, vocab_start, sp](const Tensor& ids, const Tensor& t) {
        return vocab_parallel_embedding(ids, t, vocab_start, *tp, sp);
      },
      [head_in](const Tensor& h) { return (*head_in)(h); });
  if (sp) {
    model::SequenceSplit split;
    split.parts = tp->size();
    split.gather_scalars = [tp](const Tensor& r) { return gather_from_tp(r, *tp); };
    split.own_positions = [tp](const Tensor& x) { return own_positions(x, *tp); };
    split.average_loss = [tp](const Tensor& l) {
      return reduce_from_tp(scale(l, 1.0 / tp->size()), *tp);  // equal shares of positions
    };
    split.gather_rows = [tp](const Tensor& x, const Tensor& idx) {
      return gather_routed_rows(x, idx, *tp);
    };
    split.scatter_add_rows = [tp](const Tensor& x, const Tensor& idx, const Tensor& y) {
      return scatter_add_routed_rows(x, idx, y, *tp);
    };
    model.set_sequence_split(std::move(split));
  }
  if (cfg.tie_embeddings())
    head_in->add_consumer();
  else
    s.column("lm_head", head_in);
  model.set_lm_loss([tp, vocab_start](const Tensor& logits, const Tensor& targets) {
    return vocab_parallel_cross_entropy(logits, targets, vocab_start, *tp);
  });
  return s.specs;
}

void parallelize_experts(model::Transformer& model, const Mesh& mesh, ShardMap& specs) {
  Communicator* ep = &mesh.ep();
  Communicator* tp = &mesh.tp();
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    model::MoeMlp* moe = model.moe(b);
    if (!moe) continue;
    const std::string prefix = "blocks." + std::to_string(b) + ".mlp.experts.";
    model::Experts& experts = moe->experts();
    const int64_t global = experts.local_count(), local = global / ep->size();
    std::vector<std::pair<std::string, Shape>> shapes;
    for (const auto& [name, p] : experts.named_parameters()) shapes.emplace_back(name, p.shape());
    if (ep->size() > 1) experts.shard(mesh.ep_rank() * local, local);
    for (const auto& [name, shape] : shapes) {
      ShardSpec& spec = specs.at(prefix + name);
      spec.expert = true;
      if (ep->size() > 1) spec = {0, shape, mesh.ep_rank() * local, true};
    }
    if (ep->size() > 1 || tp->size() > 1)
      moe->set_exchange({[ep, tp](const Tensor& x) { return dispatch_to_experts(x, *ep, *tp); },
                         [ep, tp](const Tensor& y) { return combine_from_experts(y, *ep, *tp); }});
  }
}

std::vector<Tensor> sequence_partial_parameters(const model::Transformer& model,
                                                const ShardMap& specs) {
  std::vector<Tensor> out;
  for (const auto& [name, p] : model.named_parameters()) {
    if (specs.at(name).dim >= 0 || specs.at(name).expert) continue;
    // A routed block's norms see its gathered rows and an MoE router the gathered sequence (or
    // rows), the same on every rank: whole gradients.
    if (name.find(".mlp.router.") != std::string::npos) continue;
    const size_t dot = name.find('.', 7);
    if (name.rfind("blocks.", 0) == 0 && model.routed(std::stoul(name.substr(7, dot - 7))) &&
        name.compare(dot + 1, 4, "norm") == 0)
      continue;
    out.push_back(p);
  }
  return out;
}

ParallelPlan parallelize(model::Transformer& model, const Mesh& mesh,
                         const modtrain::ParallelConfig& cfg, Device device,
                         const modtrain::OptimizerConfig& optimizer,
                         const OptimizerFusion& fusion) {
  ParallelPlan plan;
  const bool sp = cfg.sequence_parallel() && mesh.tp().size() > 1;
  plan.shards = parallelize_tensor(model, mesh, sp);
  parallelize_experts(model, mesh, plan.shards);
  model.to(device);
  if (sp) {  // after the move: the tensors the gradients will be on
    plan.sequence_grads = sequence_partial_parameters(model, plan.shards);
    plan.sequence_tp = &mesh.tp();
  }
  const auto params = model.named_parameters();
  // ZeRO shards dense parameters over dp and experts over edp; replicated ones split in two,
  // since the two halves' slices sum over different groups.
  const int stage = config::zero_stage(cfg);
  Communicator* dense_shard = stage >= 1 ? &mesh.dp() : nullptr;
  Communicator* expert_shard = stage >= 1 ? &mesh.edp() : nullptr;
  // Stage 3: the gradients reduce-scatter one bucket per unit, as each unit's backward ends.
  // Under pp the trainer shards each stage's own units (make_sharded_units with its held set).
  std::vector<int> unit_of;
  if (stage >= 3 && mesh.dims().pp == 1) {
    make_sharded_units(plan, model, mesh, fusion);
    for (const auto& [name, t] : params) unit_of.push_back(zero3_unit(name));
  }
  make_grad_buckets(plan, params, mesh, cfg, unit_of);
  // ZeRO at dp > 1 reads the reduced gradients from the buckets' owned slices: sum those.
  plan.sequence_grads_owned = sp && stage >= 1 && plan.dense_buckets;
  // Where the owned slices are read from (null: the parameters' own gradients).
  const GradBucketer* dense_grads = stage >= 1 ? plan.dense_buckets.get() : nullptr;
  const GradBucketer* expert_grads = stage >= 1 ? plan.expert_buckets.get() : nullptr;
  // The language model's norm and, apart, the causal predictors' (clipped by their own).
  auto norm_groups = [&](bool predictor) {
    NormGroup tp_sharded{{}, &mesh.tp(), dense_shard, dense_grads},
        ep_sharded{{}, &mesh.ep(), expert_shard, expert_grads},
        replicated{{}, nullptr, dense_shard, dense_grads},
        replicated_experts{{}, nullptr, expert_shard, expert_grads};
    for (const auto& [name, t] : params) {
      if (model::is_causal_predictor(name) != predictor) continue;
      const ShardSpec& spec = plan.shards.at(name);
      NormGroup& replicated_here = stage >= 1 && spec.expert ? replicated_experts : replicated;
      (spec.dim < 0 ? replicated_here : spec.expert ? ep_sharded : tp_sharded).params.push_back(t);
    }
    std::vector<NormGroup> groups{std::move(tp_sharded), std::move(ep_sharded),
                                  std::move(replicated)};
    if (stage >= 1) {  // each group costs a scalar all-reduce over its shard group: held ones
      groups.push_back(std::move(replicated_experts));
      std::erase_if(groups, [](const NormGroup& g) { return g.params.empty(); });
    }
    return groups;
  };
  plan.norm_groups = norm_groups(false);
  const bool has_predictor = std::any_of(params.begin(), params.end(), [](const auto& np) {
    return model::is_causal_predictor(np.first);
  });
  if (has_predictor) plan.predictor_norm_groups = norm_groups(true);
  if (stage >= 1)
    make_sharded_optimizer(plan, params, mesh, optimizer, fusion);
  else
    plan.optimizer = std::make_unique<AdamW>(params, optimizer, fusion);
  return plan;
}

int zero3_unit(const std::string& name) {
  return name.rfind("blocks.", 0) == 0 ? 1 + std::stoi(name.substr(7)) : 0;
}

std::vector<Tensor> zero3_copy_part(const std::vector<std::pair<std::string, Tensor>>& params,
                                    const OptimizerFusion& fusion) {
  std::vector<Tensor> part;
  for (const auto& [name, t] : params)
    if (fusion.copy_dtype(t) && !model::read_as_master(name)) part.push_back(t);
  return part;
}

void make_sharded_units(ParallelPlan& plan, model::Transformer& model, const Mesh& mesh,
                        const OptimizerFusion& fusion, const std::vector<bool>& held) {
  // A block's experts live in its unit, sharded over edp like their moments and gradients.
  std::vector<std::vector<Tensor>> units(1 + model.num_blocks());
  std::vector<Tensor> experts;
  std::vector<std::pair<std::string, Tensor>> sharded;
  const auto params = model.named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    if (!held.empty() && !held.at(i)) continue;  // another stage's: left whole and alone
    units[zero3_unit(name)].push_back(t);
    sharded.push_back(params[i]);
    t.impl()->storage->set_label(name);  // a read while released names the parameter
    if (plan.shards.at(name).expert) experts.push_back(t);
  }
  // The copies are registered by the optimizer made next (make_sharded_optimizer), from the
  // same fusion: its first gather finds each copy-part member's copy kept.
  plan.units = std::make_unique<ShardedUnits>(std::move(units), mesh.dp(), /*prefetch=*/true,
                                              experts, &mesh.edp(),
                                              zero3_copy_part(sharded, fusion),
                                              fusion.weight_copies.value_or(DType::BF16));
  model.set_unit_hooks(plan.units->hooks());
}

void make_sharded_optimizer(ParallelPlan& plan,
                            const std::vector<std::pair<std::string, Tensor>>& params,
                            const Mesh& mesh, const modtrain::OptimizerConfig& optimizer,
                            const OptimizerFusion& fusion, const std::vector<bool>& held) {
  plan.optimizer.reset();  // its weight copies go before the new one keeps them
  std::vector<ShardedAdamW::Param> zp;
  std::vector<bool> is_expert;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, t] = params[i];
    const bool here = held.empty() || held.at(i);  // ZeRO-3 shards only the held ones
    zp.push_back({name, t, takes_weight_decay(name, optimizer), model::is_causal_predictor(name),
                  plan.units && here ? plan.units->owned_values(t) : Tensor()});
    is_expert.push_back(plan.shards.at(name).expert);
  }
  plan.optimizer = std::make_unique<Zero1Optimizer>(
      zp, is_expert, adamw_hyper(optimizer), mesh.dp(), mesh.edp(), fusion,
      plan.dense_buckets.get(), plan.expert_buckets.get(), held);
}

void make_grad_buckets(ParallelPlan& plan,
                       const std::vector<std::pair<std::string, Tensor>>& params,
                       const Mesh& mesh, const modtrain::ParallelConfig& cfg,
                       const std::vector<int>& unit_of) {
  std::vector<std::pair<std::string, Tensor>> dense, experts;
  std::vector<int> dense_units, expert_units;  // unit_of split alike (ZeRO-3)
  for (size_t i = 0; i < params.size(); ++i) {
    const bool expert = plan.shards.at(params[i].first).expert;
    (expert ? experts : dense).push_back(params[i]);
    if (!unit_of.empty()) (expert ? expert_units : dense_units).push_back(unit_of[i]);
  }
  const int dp = mesh.dims().dp, stage = config::zero_stage(cfg);
  // Stage 1 reduce-scatters; stage 2 also lets go of the full gradients (data_parallel.h).
  const GradReduce reduce = stage >= 1 ? GradReduce::ReduceScatter : GradReduce::AllReduce;
  const bool release = stage >= 2;
  // Norm groups reading owned slices from the old bucketers read them from the new ones.
  const GradBucketer* old_dense = plan.dense_buckets.get();
  const GradBucketer* old_experts = plan.expert_buckets.get();
  plan.dense_buckets.reset();
  plan.expert_buckets.reset();
  if (dp > 1 && !dense.empty())
    plan.dense_buckets = std::make_unique<GradBucketer>(dense, mesh.dp(), cfg.bucket_mb(), 0,
                                                        reduce, release, dense_units);
  // Expert gradients: the all-to-all summed the ep group's tokens in; the edp group (dp / ep
  // replicas times the tp shares of the slots) sums the rest; dividing by dp makes the mean.
  if (!experts.empty() && (dp > 1 || mesh.edp().size() > 1))
    plan.expert_buckets =
        std::make_unique<GradBucketer>(experts, mesh.edp(), cfg.bucket_mb(), dp, reduce, release,
                                       expert_units);
  for (auto* groups : {&plan.norm_groups, &plan.predictor_norm_groups})
    for (NormGroup& g : *groups) {
      if (!g.owned) continue;
      if (g.owned == old_dense) g.owned = plan.dense_buckets.get();
      else if (g.owned == old_experts) g.owned = plan.expert_buckets.get();
    }
}

LeafGradReady ParallelPlan::grad_ready_hook() const {
  std::vector<LeafGradReady> hooks;
  if (dense_buckets) hooks.push_back(dense_buckets->ready_hook());
  if (expert_buckets) hooks.push_back(expert_buckets->ready_hook());
  if (units) hooks.push_back(units->release_hook());  // after the bucket has packed the gradient
  if (hooks.size() <= 1) return hooks.empty() ? LeafGradReady() : hooks.front();
  return [hooks](const Tensor& leaf) {
    for (const LeafGradReady& h : hooks) h(leaf);
  };
}

LeafGradReady ParallelPlan::accumulate_hook() const {
  return units ? units->release_hook() : LeafGradReady();
}

void ParallelPlan::finish_grad_sync() const {
  if (dense_buckets) dense_buckets->finish();
  if (expert_buckets) expert_buckets->finish();
  if (!sequence_grads.empty())
    sum_sequence_grads(sequence_grads, *sequence_tp,
                       sequence_grads_owned ? dense_buckets.get() : nullptr);
  if (units) units->release_all();
}

ParallelPlan::WholeParameters::WholeParameters(const ParallelPlan& plan) : units(plan.units.get()) {
  if (units) units->gather_all();
}

ParallelPlan::WholeParameters::~WholeParameters() {
  if (units) units->reshard_all();
}

void sum_sequence_grads(const std::vector<Tensor>& params, Communicator& tp,
                        const GradBucketer* owned) {
  // The tensors summed: whole gradients, or the owned slices (the same range of the same
  // parameter on every tp rank of a dp rank, since replicated parameters have one shape).
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    Tensor g = owned ? owned->owned_grad(p) : p.grad();
    if (g.defined()) grads.push_back(g.view({g.numel()}));
  }
  // One all-reduce of all of them: [sum of numels], packed in order (a no-grad parameter or an
  // empty slice, absent alike on every tp rank, is skipped).
  int64_t total = 0;
  for (const Tensor& g : grads) total += g.numel();
  if (total == 0) return;
  Tensor flat = Tensor::empty({total}, grads.front().dtype(), grads.front().device());
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.narrow0(at, g.numel()).copy_from(g);
    at += g.numel();
  }
  tp.all_reduce(flat);
  at = 0;
  for (Tensor& g : grads) {
    g.copy_from(flat.narrow0(at, g.numel()));
    at += g.numel();
  }
}

std::vector<Tensor> NormGroup::grads() const {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    if (owned) {
      if (Tensor g = owned->owned_grad(p); g.defined()) out.push_back(g);
      continue;
    }
    if (!p.grad().defined()) continue;
    if (!shard_over) {
      out.push_back(p.grad());
      continue;
    }
    const auto [begin, end] = zero1_owned(p.numel(), shard_over->rank(), shard_over->size());
    if (end > begin) out.push_back(p.grad().view({p.numel()}).narrow0(begin, end - begin));
  }
  return out;
}

Communicator& group_of(const ShardSpec& spec, const Mesh& mesh) {
  return spec.expert ? mesh.ep() : mesh.tp();
}

Tensor gather_parameter(const Tensor& local, const ShardSpec& spec, Communicator& tp) {
  if (spec.dim < 0 || tp.size() == 1) return local;
  Shape parts_shape = local.shape();
  parts_shape.insert(parts_shape.begin(), tp.size());
  // Gathered where the shards live (NCCL carries device tensors), reassembled on the host.
  Tensor parts = Tensor::empty(parts_shape, local.dtype(), local.device());
  tp.all_gather(local.view({1, local.numel()}), parts.view({tp.size(), local.numel()}));
  if (parts.device() != Device::CPU) parts = parts.to(Device::CPU);
  Tensor full = Tensor::empty(spec.global_shape, local.dtype());
  // Rank r's part goes to [r * len, (r + 1) * len) along spec.dim.
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < spec.dim; ++i) outer *= local.size(i);
  for (int64_t i = spec.dim + 1; i < local.dim(); ++i) inner *= local.size(i);
  const int64_t len = local.size(spec.dim);
  const size_t es = dtype_size(local.dtype()), chunk = len * inner * es;
  const char* src = static_cast<const char*>(parts.raw_data());
  char* dst = static_cast<char*>(full.raw_data());
  for (int r = 0; r < tp.size(); ++r)
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + (o * spec.global_shape[spec.dim] + r * len) * inner * es,
                  src + (static_cast<int64_t>(r) * local.numel() + o * len * inner) * es, chunk);
  return full;
}

void check_same_routing(const model::ForwardResult& result, Communicator& tp) {
  if (tp.size() == 1) return;
  for (size_t i = 0; i < result.routed_idx.size(); ++i) {
    const Tensor& idx = result.routed_idx[i];
    Tensor all = Tensor::empty({tp.size(), idx.numel()}, DType::I64);
    tp.all_gather(idx.view({1, idx.numel()}), all);
    for (int r = 1; r < tp.size(); ++r)
      if (std::memcmp(all.data<int64_t>(), all.data<int64_t>() + r * idx.numel(), idx.nbytes()) != 0)
        throw std::runtime_error("tensor parallelism: routed block " + std::to_string(i) +
                                 " chose different tokens on tp rank " + std::to_string(r) +
                                 " than on tp rank 0 (their residual streams differ)");
  }
}

}  // namespace mod::parallel
