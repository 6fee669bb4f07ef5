// Applies Megatron-style tensor parallelism to a built Transformer. Every rank builds the full
// model from the same seed, then keeps its shard of each split parameter, so a layout starts
// from exactly the single-process initialisation.
//
//   parameter (global shape)          split    tp rank r keeps             hooks
//   attn.wq/wk/wv.weight [D, D]       column   rows of heads r*H/tp..      copy_to_tp on input
//   attn.wo.weight [D, D]             row      columns of those heads      reduce_from_tp on output
//   mlp.up/gate.weight [F, D]         column   rows r*F/tp..               copy_to_tp on input
//   mlp.down.weight [D, F]            row      columns r*F/tp..            reduce_from_tp on output
//   embed.weight [V, D]               vocab    rows r*V/tp..               masked lookup + reduce
//   lm_head.weight [V, D] (or tied)   vocab    rows r*V/tp..               copy_to_tp; vocab-parallel CE
//   norms, routers, predictors        replicated (same inputs on every tp rank, same routing)
//
// Sequence parallelism (parallel.sequence_parallel) keeps the residual stream between blocks
// split over the sequence (tp rank r: positions [r*T/tp, (r+1)*T/tp)): in dense blocks and in
// front of the LM head, gather_seq_from_tp replaces copy_to_tp and reduce_scatter_seq_to_tp
// replaces reduce_from_tp, and the embedding reduce-scatters. A routed block gathers its C rows
// (gather_routed_rows), runs as under plain TP on them, and scatters back into the split stream
// (scatter_add_routed_rows); its router scores are gathered (S scalars a sequence), so top-C is
// taken from every position, identically on every rank. An MoE MLP outside a routed block
// all-gathers the sequence (gather_seq_whole_from_tp), routes and runs as under plain TP, and
// keeps its positions of the output (split_seq_to_tp). Replicated parameters that now see only
// the rank's positions (dense blocks' norms, the final norm, MoD routers, predictors; not MoE
// routers, which see the gathered sequence) have their gradients summed over tp after backward
// (ParallelPlan::sequence_grads).
//
// Expert parallelism (parallelize_experts) splits the stacked expert weights of every MoE MLP
// along dim 0, the global expert index: ep rank j keeps experts [j*E/ep, (j+1)*E/ep), replicated
// over tp (tokens are de-duplicated across tp instead) and over the dp groups of ep ranks.
//
//   parameter (global shape)                 ep rank j keeps      exchange
//   mlp.experts.up/gate [E, F, D]            experts j*E/ep..     dispatch_to_experts, then
//   mlp.experts.down [E, D, F]               experts j*E/ep..     combine_from_experts
//   mlp.router.weight [E', D]                replicated
//
// parallelize applies both, then data parallelism (gradient buckets) and the optimizer (AdamW,
// or ZeRO's sharded AdamW; at ZeRO stage 3 the parameters sharded in units, zero3.h), and
// returns the plan a training step runs with: the model itself never learns it is parallel.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/optimizer.h"
#include "parallel/zero3.h"

namespace mod::parallel {

// Where a parameter's local tensor sits in its global tensor: the slice [offset, offset +
// local.size(dim)) along dim. dim -1: replicated (local is the whole tensor).
struct ShardSpec {
  int dim = -1;
  Shape global_shape;
  int64_t offset = 0;
  // An expert weight: split over ep (dim 0, when ep > 1), and its gradient is reduced over the
  // expert data-parallel group (mesh.edp()) rather than dp.
  bool expert = false;
};
// Every parameter by name.
using ShardMap = std::map<std::string, ShardSpec>;

// Shards model in place for mesh.tp() (nothing to do at tp = 1) and returns every parameter's
// spec; with sequence_parallel (tp > 1) the stream is split over the sequence as above.
ShardMap parallelize_tensor(model::Transformer& model, const Mesh& mesh,
                            bool sequence_parallel = false);

// Under sequence parallelism: the replicated parameters whose gradients are partial sums over
// this rank's positions (see above), to be summed over tp.
std::vector<Tensor> sequence_partial_parameters(const model::Transformer& model,
                                                const ShardMap& specs);

// Shards the experts of every MoE MLP over mesh.ep() and routes their slots through the
// expert-parallel exchange (needed whenever ep or tp > 1); marks expert weights in specs.
void parallelize_experts(model::Transformer& model, const Mesh& mesh, ShardMap& specs);

// Debug check: every tp rank chose the same tokens in every routed block (they must, since
// their inputs are bitwise equal). Throws naming the block and the first differing rank.
void check_same_routing(const model::ForwardResult& result, Communicator& tp);

// The global tensor of a parameter, assembled on every rank of `group` (all-gather): mesh.tp()
// for tensor-parallel slices, mesh.ep() for experts (see group_of).
Tensor gather_parameter(const Tensor& local, const ShardSpec& spec, Communicator& group);
// The group a parameter's slices are spread over: ep for experts, tp otherwise.
Communicator& group_of(const ShardSpec& spec, const Mesh& mesh);

// Copy of the slice [offset, offset + len) of t along dim.
Tensor slice_dim(const Tensor& t, int dim, int64_t offset, int64_t len);

// Parameters whose squared gradient norms clipping sums over one group: tp-sharded ones over
// tp, ep-sharded experts over ep, and replicated ones (equal wherever they are held) nowhere, so
// each parameter counts once. Their gradients are already reduced over dp (experts: edp).
// Under ZeRO (stage >= 1) a rank holds reduced gradients only on the slices it owns (zero1.h): it
// adds the squares of those, and shard_over (dp; experts edp) sums them first.
struct NormGroup {
  std::vector<Tensor> params;
  Communicator* sum_over = nullptr;    // null: replicated
  Communicator* shard_over = nullptr;  // ZeRO's group; null: whole gradients
  // The bucketer whose shards hold the owned slices (under ZeRO-2 the only copy); null: the
  // owned slices of the parameters' own gradients.
  const GradBucketer* owned = nullptr;

  // The gradients whose squares this rank adds: whole, or (ZeRO-1) its owned slices of them,
  // flattened; parameters without a gradient (or an empty slice) are left out.
  std::vector<Tensor> grads() const;
};

// How a parallelized model's gradients are synchronised and clipped and its parameters
// updated: what a training step runs with.
struct ParallelPlan {
  ShardMap shards;
  // Both reduce-scatter from ZeRO stage 1 on (each rank then holds its owned slices; stage 2
  // drops the full gradients once packed), else all-reduce.
  std::unique_ptr<GradBucketer> dense_buckets;   // dense parameters over dp (dp > 1)
  std::unique_ptr<GradBucketer> expert_buckets;  // expert weights over edp
  std::unique_ptr<Optimizer> optimizer;          // AdamW, sharded by ZeRO stage >= 1
  // ZeRO stage 3: the parameters sharded over dp, whole only while their unit runs; null below.
  std::unique_ptr<ShardedUnits> units;
  // Sequence parallelism: sequence_partial_parameters, whose gradients finish_grad_sync sums
  // over sequence_tp (one all-reduce of them all); empty otherwise.
  std::vector<Tensor> sequence_grads;
  Communicator* sequence_tp = nullptr;
  // ZeRO at dp > 1: what is summed is this rank's owned slices in dense_buckets (after the dp
  // reduce-scatter; stage 2 and 3 keep no whole gradients), not the parameters' gradients.
  bool sequence_grads_owned = false;
  // tp-sharded, ep-sharded, replicated: the order the norm's squares are added in. The causal
  // predictors' parameters are in predictor_norm_groups alone (empty without a predictor):
  // they are clipped by their own norm (optimizer's detached_scale).
  std::vector<NormGroup> norm_groups, predictor_norm_groups;

  // For the backward of a step's last micro-batch: buckets start all-reducing as their
  // gradients become final (each bucketer ignores the other's parameters).
  LeafGradReady grad_ready_hook() const;
  // For the backward of every earlier micro-batch: ZeRO-3's release of each unit after its
  // backward; null below stage 3.
  LeafGradReady accumulate_hook() const;
  // Every parameter whole on this rank while it lives (ZeRO-3: gathered, then resharded from
  // the whole values at its end, so what was written into them is kept); nothing otherwise.
  struct WholeParameters {
    explicit WholeParameters(const ParallelPlan& plan);
    ~WholeParameters();
    WholeParameters(const WholeParameters&) = delete;
    WholeParameters& operator=(const WholeParameters&) = delete;
    ShardedUnits* units;
  };
  // Waits for every bucket: gradients are then dp means (experts: summed over edp, / dp);
  // under ZeRO-1 only on the slices this rank owns. Then sums sequence_grads over tp (under
  // ZeRO at dp > 1 their owned slices: sequence_grads_owned), and
  // releases any ZeRO-3 unit still gathered.
  void finish_grad_sync() const;
};

// (Re)makes plan's dp gradient buckets (experts: over edp) over `params` alone, as parallelize
// does over every parameter; a pipeline stage passes the parameters it owns, so its dp group
// reduces only those. plan.shards must know every name. `unit_of` (ZeRO-3: each dense
// parameter's unit, in order; empty otherwise) gives every unit a bucket of its own. The norm
// groups that read owned slices (ZeRO) read them from the new buckets; the optimizer still
// reads the old ones: remake it (make_sharded_optimizer).
void make_grad_buckets(ParallelPlan& plan,
                       const std::vector<std::pair<std::string, Tensor>>& params,
                       const Mesh& mesh, const modtrain::ParallelConfig& cfg,
                       const std::vector<int>& unit_of = {});

// ZeRO-3's unit of a parameter by name: 0 the outer one (embedding, final norm, head), 1 + b
// block b.
int zero3_unit(const std::string& name);
// ZeRO-3's copy part of `params` under `fusion`: those whose optimizer keeps a weight copy
// (OptimizerFusion::copy_dtype) and that forward reads only through it (not
// model::read_as_master), gathered in the copies' dtype into the copies alone.
std::vector<Tensor> zero3_copy_part(const std::vector<std::pair<std::string, Tensor>>& params,
                                    const OptimizerFusion& fusion);
// ZeRO-3: plan.units over the model's parameters (named_parameters order) that `held` marks
// (empty: all; a pipeline stage passes what it owns, and the other stages' stay whole and
// untouched), sharded over dp (experts over edp), and the model's unit hooks set to them.
// `fusion`: the optimizer's (made next), whose weight copies the copy part is gathered into.
void make_sharded_units(ParallelPlan& plan, model::Transformer& model, const Mesh& mesh,
                        const OptimizerFusion& fusion, const std::vector<bool>& held = {});

// ZeRO's optimizer (Zero1Optimizer) over the model's parameters `params` (named_parameters
// order), sharded over dp (experts over edp), reading the owned gradient slices from plan's
// current buckets. held (empty: all): the parameters this rank updates, a pipeline stage's own
// (set after make_grad_buckets over them); the others keep no moments.
void make_sharded_optimizer(ParallelPlan& plan,
                            const std::vector<std::pair<std::string, Tensor>>& params,
                            const Mesh& mesh, const modtrain::OptimizerConfig& optimizer,
                            const OptimizerFusion& fusion, const std::vector<bool>& held = {});

// Each parameter's gradient (where defined) becomes its sum over tp, in one all-reduce; with
// `owned` (a reduce-scatter bucketer), this rank's owned slice of it in the buckets instead.
void sum_sequence_grads(const std::vector<Tensor>& params, Communicator& tp,
                        const GradBucketer* owned = nullptr);

// The parallelize step: tensor parallelism, then expert parallelism (both on the host, so
// every device starts from the same initialisation), then the model moves to `device` and the
// dp buckets (parallel.bucket_mb) and the optimizer's state (AdamW under `optimizer`, sharded
// from parallel.zero_stage 1 on, run as `fusion` says: optimizer.h) are allocated beside its parameters.
ParallelPlan parallelize(model::Transformer& model, const Mesh& mesh,
                         const modtrain::ParallelConfig& cfg, Device device,
                         const modtrain::OptimizerConfig& optimizer,
                         const OptimizerFusion& fusion = {});

}  // namespace mod::parallel
