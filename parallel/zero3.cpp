// ZeRO-3's sharded parameter units (see zero3.h).
#include "parallel/zero3.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "core/backend.h"
#include "core/weight_copy.h"
#include "parallel/zero1.h"

namespace mod::parallel {

// A parameter keeps its Storage object, since the views its ops saved for backward (matmul's
// reshaped weight) share it; only the bytes go and come back (Storage::resize), so every view
// sees the gathered values. Under BF16 a parameter's weight copy (core/weight_copy.h) is what
// its ops saved, so the copy's storage goes and comes back with the master's: rewritten from
// the master as the unit is gathered (backward reads the saved copy without asking for it),
// and no whole bf16 model stays on every rank between the units' uses.
namespace {
WeightCopy* allocated_copy(const Tensor& p) {
  WeightCopy* copy = p.impl()->weight_copy.get();
  return copy && copy->value.defined() ? copy : nullptr;
}
}  // namespace

ShardedUnits::ShardedUnits(std::vector<std::vector<Tensor>> units, Communicator& dp,
                           bool prefetch, const std::vector<Tensor>& experts, Communicator* edp)
    : prefetch_(prefetch), dp_(dp) {
  std::unordered_set<const TensorImpl*> is_expert;
  for (const Tensor& e : experts) is_expert.insert(e.impl());
  if (!experts.empty() && !edp)
    throw std::logic_error("ZeRO-3: experts to shard but no expert data-parallel group");
  for (auto& params : units) {
    Unit unit;
    for (Tensor& p : params) {
      if (p.impl()->offset_bytes != 0 || p.impl()->storage->bytes() != p.nbytes())
        throw std::logic_error("ZeRO-3: parameter " + describe(p) + " is a view into a larger storage");
      where_[p.impl()] = {units_.size(), unit.members.size()};
      Communicator* comm = is_expert.count(p.impl()) ? edp : &dp_;
      auto group = std::find_if(unit.groups.begin(), unit.groups.end(),
                                [comm](const Group& g) { return g.comm == comm; });
      if (group == unit.groups.end()) {
        unit.groups.emplace_back();
        group = unit.groups.end() - 1;
        group->comm = comm;
      }
      const auto [begin, end] = zero1_owned(p.numel(), comm->rank(), comm->size());
      unit.members.push_back({p, Tensor::empty({end - begin}, p.dtype(), p.device()), comm,
                              group->chunk_total});
      group->chunk_total += zero1_chunk(p.numel(), comm->size());
    }
    units_.push_back(std::move(unit));
  }
  for (Unit& unit : units_) {
    take_owned(unit);
    unit.gathered = true;
  }
  release_all();
}

void ShardedUnits::take_owned(Unit& unit) {
  for (Member& m : unit.members) {
    const auto [begin, end] = zero1_owned(m.param.numel(), m.group->rank(), m.group->size());
    if (end > begin) m.owned.copy_from(m.param.view({m.param.numel()}).narrow0(begin, end - begin));
  }
}

void ShardedUnits::start_gather(size_t u) {
  Unit& unit = units_[u];
  if (in_flight(u)) return;
  const Tensor& first = unit.members.front().param;
  for (Group& g : unit.groups) {
    // send [L]: each member's owned slice at its chunk's offset (the padding is never read).
    g.send = Tensor::empty({g.chunk_total}, first.dtype(), first.device());
    for (const Member& m : unit.members)
      if (m.group == g.comm && m.owned.numel() > 0)
        g.send.narrow0(m.at, m.owned.numel()).copy_from(m.owned);
    g.all = Tensor::empty({g.comm->size() * g.chunk_total}, first.dtype(), first.device());
    g.work = g.comm->all_gather_async(g.send, g.all);
  }
}

bool ShardedUnits::in_flight(size_t u) const {
  for (const Group& g : units_[u].groups)
    if (g.work) return true;
  return false;
}

void ShardedUnits::wait_gathers(Unit& unit) {
  for (Group& g : unit.groups)
    if (g.work) {
      g.work->wait();
      g.work.reset();
    }
}

void ShardedUnits::prefetch(size_t u) {
  if (u >= units_.size() || units_[u].members.empty() || units_[u].gathered) return;
  start_gather(u);
}

void ShardedUnits::gather(size_t u) {
  Unit& unit = units_[u];
  if (unit.members.empty()) return;
  start_gather(u);
  wait_gathers(unit);
  for (Group& g : unit.groups) {
    const Tensor all = g.all;
    g.send = g.all = Tensor();
    const int size = g.comm->size();
    for (Member& m : unit.members) {
      if (m.group != g.comm) continue;
      m.param.impl()->storage->resize(m.param.nbytes());  // a parameter spans its storage
      Tensor flat = m.param.view({m.param.numel()});
      const int64_t n = m.param.numel(), c = zero1_chunk(n, size);
      // Rank r's slice of this member sits at r * L + at in `all`.
      for (int r = 0; r < size; ++r) {
        const int64_t begin = std::min(n, r * c), len = std::min(n, begin + c) - begin;
        if (len > 0) flat.narrow0(begin, len).copy_from(all.narrow0(r * g.chunk_total + m.at, len));
      }
      if (WeightCopy* copy = allocated_copy(m.param)) {
        copy->value.impl()->storage->resize(copy->value.nbytes());
        backend_of(m.param).convert(m.param, copy->value);
        mark_written_with_copy(m.param);
      }
    }
  }
  unit.gathered = true;
  unit.pending = static_cast<int>(unit.members.size());
}

void ShardedUnits::release(size_t u) {
  Unit& unit = units_[u];
  if (in_flight(u)) {  // its buffers must outlive the collective, which every rank has started
    wait_gathers(unit);
    for (Group& g : unit.groups) g.send = g.all = Tensor();
  }
  for (Member& m : unit.members) {
    m.param.impl()->storage->resize(0);
    if (WeightCopy* copy = allocated_copy(m.param)) copy->value.impl()->storage->resize(0);
  }
  unit.gathered = false;
}

void ShardedUnits::release_all() {
  for (size_t u = 0; u < units_.size(); ++u)
    if (units_[u].gathered || in_flight(u)) release(u);
}

const Tensor& ShardedUnits::owned_values(const Tensor& p) const {
  auto it = where_.find(p.impl());
  if (it == where_.end())
    throw std::logic_error("ShardedUnits: " + describe(p) + " is in no unit");
  return units_[it->second.first].members[it->second.second].owned;
}

void ShardedUnits::gather_all() {
  for (size_t u = 0; u < units_.size(); ++u) gather(u);
  all_whole_ = true;
}

void ShardedUnits::reshard_all() {
  for (Unit& unit : units_)
    if (unit.gathered) take_owned(unit);
  release_all();
  all_whole_ = false;
}

model::UnitHooks ShardedUnits::hooks() {
  model::UnitHooks h;
  h.begin_forward = [this] {
    if (all_whole_) return;
    gather(0);
    if (prefetch_) prefetch(1);  // block 0 travels while the embedding runs
  };
  h.end_forward = [this] {
    if (!all_whole_ && !grad_enabled()) release(0);  // else backward's head needs it first
  };
  h.enter_block = [this](size_t b) {
    if (all_whole_) return;
    gather(1 + b);
    if (prefetch_) prefetch(2 + b);  // block b + 1 travels while block b computes
  };
  h.leave_block = [this](size_t b, const Tensor& x, const Tensor& aux) {
    if (all_whole_) return std::pair{x, aux};
    release(1 + b);
    return gather_unit_for_backward(x, aux, [this, b] {
      gather(1 + b);
      if (prefetch_ && b > 0) prefetch(b);  // block b - 1 travels while block b's backward runs
    });
  };
  return h;
}

LeafGradReady ShardedUnits::release_hook() {
  return [this](const Tensor& leaf) {
    auto it = where_.find(leaf.impl());
    if (all_whole_ || it == where_.end()) return;
    Unit& unit = units_[it->second.first];
    if (--unit.pending == 0 && unit.gathered) release(it->second.first);
  };
}

std::pair<Tensor, Tensor> gather_unit_for_backward(const Tensor& x, const Tensor& aux,
                                                   std::function<void()> before_backward) {
  const bool with_aux = aux.defined();
  if (!any_requires_grad({x, with_aux ? aux : x})) return {x, aux};
  Tensor out = detach(x), out_aux = with_aux ? detach(aux) : Tensor();
  std::vector<Tensor> inputs{x};
  if (with_aux) inputs.push_back(aux);
  auto backward_fn = [fn = std::move(before_backward)](const std::vector<Tensor>& grads,
                                                      const NeedsGrad&) {
    fn();
    return grads;
  };
  if (with_aux)
    record_outputs({&out, &out_aux}, Op::GatherUnitForBackward, inputs, backward_fn);
  else
    record_outputs({&out}, Op::GatherUnitForBackward, inputs, backward_fn);
  return {out, out_aux};
}

}  // namespace mod::parallel
