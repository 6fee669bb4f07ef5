// ZeRO-3 over dp, FSDP-style: the parameters themselves sharded. The model is cut into units,
// the outer one (embedding, final norm, head) and one per block (its norms, attention, MLP and
// MoD's router and predictor, and MoE's experts). Rank r keeps only its owned slice of every
// parameter's flattened tensor (zero1_owned over its shard group, the split of ZeRO-1's moments
// and ZeRO-2's gradients), which the sharded AdamW (zero1.h, Param::owned_values) updates in
// place. The shard group is dp, but experts shard over edp (the ranks holding the same experts,
// mesh.h), as their moments and gradients do: a unit with experts gathers twice, once a group.
// Under tp the tensors are each rank's tp shards, so stage 3 shards the shards (2-D), gathering
// over dp only. A unit's parameters are whole only while it runs:
//
//   forward:  block b all-gathered before it runs, released after (leave_block)
//   backward: all-gathered again by an identity node on the block's outputs, whose backward
//             runs before any of the block's (Op::GatherUnitForBackward); released when every
//             parameter of the unit has its final gradient (release_hook, every micro-batch).
//             A recomputed block (train.recompute) reruns its region inside that window, so the
//             recomputation reads the parameters gathered again, and they go after its backward
//   outer:    gathered at the start of forward and kept until backward has finished with it,
//             since the head runs last in forward and first in backward (FSDP's root unit);
//             released after a forward without gradients
//   prefetch: one unit ahead (FSDP's forward and backward prefetch, limit 1): entering block b
//             starts block b + 1's all-gather (all_gather_async) and the start of forward block
//             0's, so each travels while the block before computes; backward's gather of block
//             b starts block b - 1's. At most two blocks are whole or in flight at once, as
//             without prefetch (there the next block's gather buffer and parameters overlap).
//             The gathered values are the same bytes either way, so results are bitwise equal.
//
// Under BF16 with the optimizer's weight copies each unit has two parts, each its own all-gather:
// the copy part (what forward reads only through a bf16 copy: matrices, norms, experts) moves
// at 2 bytes an element, each rank converting its owned f32 slice, straight into the copies,
// marked current at their masters' stamps; its masters stay released through the step. The f32
// part (read as masters: the embedding, routers, the predictor's logit layer) moves as f32.
// convert(owned slice) is that slice of convert(master), so results are bitwise those of
// gathering f32. gather_all moves both parts in f32: masters whole, copies rewritten from them.
//
// Released means the parameter's storage holds no bytes (the object stays: views of it saved for
// backward see the values again once gathered), and any read throws, naming the parameter. The
// gradients are reduce-scattered by the ZeRO-2 bucketer (data_parallel.h) with one bucket per
// unit. Invariant: every dp rank gathers the same units in the same order (the graph is the same
// on every rank: MoD's shapes are static), so the all-gathers match. On a GPU the same code runs
// on device tensors, the gathers on NCCL's comm stream; a captured step gathers into the graph's
// pool and ends, like every step, with every unit released and nothing in flight, the state
// each replay starts from (docs/parallel.md "ZeRO-3 on GPUs").
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "model/transformer.h"
#include "parallel/communicator.h"

namespace mod::parallel {

class ShardedUnits {
 public:
  // units[u]: the parameters of unit u (0: the outer unit; 1 + b: block b), whole and equal on
  // every rank of their shard group: dp, or edp for those in `experts`; empty for a unit the
  // rank does not hold (another pipeline stage's block: its gathers send nothing). Each rank
  // copies out its owned slices and releases the whole tensors. prefetch false: each unit
  // gathered only when needed (the tests' reference).
  // copy_part: the members forward reads only through their weight copies in copy_dtype
  // (their optimizer keeps them: keep_weight_copy, before the first gather), gathered in that
  // dtype into the copies alone; the rest move in f32. The split must be the same on every
  // rank of a group (checked here, one all-reduce a group when copy_part is not empty).
  ShardedUnits(std::vector<std::vector<Tensor>> units, Communicator& dp, bool prefetch = true,
               const std::vector<Tensor>& experts = {}, Communicator* edp = nullptr,
               const std::vector<Tensor>& copy_part = {}, DType copy_dtype = DType::BF16);

  size_t size() const { return units_.size(); }
  // Collective over dp: unit u's parameters whole from every rank's owned slices (finishing
  // its prefetch if one is in flight); its copy part's weight copies whole instead, their
  // masters left released, unless `masters` (gather_all): then every master whole, and each
  // copy rewritten from it.
  void gather(size_t u, bool masters = false);
  // Starts unit u's all-gather unless it is whole or in flight; gather(u) finishes it. Collective
  // over dp: every rank prefetches the same units in the same order.
  void prefetch(size_t u);
  bool in_flight(size_t u) const;
  // Unit u's whole parameters let go (a prefetch in flight is waited out first); the owned
  // slices stay.
  void release(size_t u);
  bool gathered(size_t u) const { return units_[u].gathered; }
  void release_all();
  // This rank's slice of parameter p, flattened [owned length]: the values the optimizer updates.
  const Tensor& owned_values(const Tensor& p) const;
  // Bytes received by this object's all-gathers so far (every rank's slices, padding included):
  // the units' gathers for compute, their f32 part and their copy part (in the copies' dtype,
  // 2 bytes an element for bf16), and gather_all's (every master, f32).
  struct GatheredBytes {
    int64_t f32 = 0, copies = 0, masters = 0;
  };
  const GatheredBytes& gathered_bytes() const { return gathered_bytes_; }

  // The model's unit boundaries (Transformer::set_unit_hooks); `this` must outlive the model's use.
  model::UnitHooks hooks();
  // For every micro-batch's backward: releases a unit once all its parameters' gradients are
  // final. A unit whose parameter got no gradient stays gathered until release_all. keep_outer:
  // blocks only, for a pipeline stage's backwards before its last micro-batch's, where another
  // micro-batch in flight still needs the head (no node gathers the outer unit again).
  LeafGradReady release_hook(bool keep_outer = false);

  // Every parameter whole (collective), for the host's reads and writes (checkpoints, weights)
  // and evaluation: until reshard_all the hooks neither gather nor release, so each rank may run
  // as many forwards as it likes.
  void gather_all();
  // After gather_all: each rank takes its owned slices from the whole values (which may have
  // been overwritten, by a resume) and releases them.
  void reshard_all();

 private:
  struct Member {
    Tensor param;   // the module's tensor: whole while gathered, its storage empty otherwise
    Tensor owned;   // [end - begin] of zero1_owned(numel) over its group
    Communicator* group = nullptr;  // what it is sharded over: dp, or edp for an expert
    int64_t at = 0;  // offset of its padded chunk in its group's gather buffer
    bool into_copy = false;  // in the copy part: gathered into its weight copy, master released
  };
  struct Group {  // one all-gather of the unit: its members sharded over `comm`, of one part
    Communicator* comm = nullptr;
    bool copies = false;         // the copy part's members (in copy_dtype_ unless gather_all's)
    int64_t chunk_total = 0;     // the gather's per-rank length: its members' chunks summed
    std::unique_ptr<Work> work;  // the all-gather in flight (null: none)
    Tensor send, all;            // its buffers, held until it is waited
  };
  struct Unit {
    std::vector<Member> members;
    std::vector<Group> groups;  // by (group, part), in the order their first members come
    bool gathered = true;
    bool masters_whole = true;  // gathered with every master whole (the copy part's too)
    bool in_flight_as_masters = false;  // what the gathers in flight are for
    int pending = 0;          // members whose gradient is not final yet this backward
  };
  void take_owned(Unit& unit);  // owned slices from the whole values
  // Packs the owned slices and starts the all-gathers (masters: all in f32, for gather_all).
  void start_gather(size_t u, bool masters);
  void wait_gathers(Unit& unit);  // waits out the all-gathers in flight, lets go of the buffers
  void check_same_split(Communicator* edp);  // throws unless every rank splits units alike

  std::vector<Unit> units_;
  bool all_whole_ = false;  // between gather_all and reshard_all
  bool prefetch_ = true;
  DType copy_dtype_;
  GatheredBytes gathered_bytes_;
  std::unordered_map<TensorImpl*, std::pair<size_t, size_t>> where_;  // param -> (unit, member)
  Communicator& dp_;
};

// An identity on x and aux (undefined: left out) whose backward first calls before_backward:
// the node that gathers a block's parameters before its backward (Op::GatherUnitForBackward).
std::pair<Tensor, Tensor> gather_unit_for_backward(const Tensor& x, const Tensor& aux,
                                                   std::function<void()> before_backward);

}  // namespace mod::parallel
