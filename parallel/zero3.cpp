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
// its ops saved, so the copy's storage goes and comes back with the unit too, and no whole
// bf16 model stays on every rank between the units' uses. The copy part (members the forward
// reads only through their copies) is gathered in the copies' dtype straight into them, their
// masters never whole; an f32 member with a copy (the tied embedding) has it rewritten from
// the gathered master, since backward reads the saved copy without asking for it.
namespace {
WeightCopy* allocated_copy(const Tensor& p) {
  WeightCopy* copy = p.impl()->weight_copy.get();
  return copy && copy->value.defined() ? copy : nullptr;
}

// Rank r's slice of a member of n elements sits at r * L + at in a gather's receive buffer
// `all` (L: the gather's per-rank length); each lands at r * chunk in the flat tensor.
void unpack(const Tensor& all, int64_t per_rank, int64_t at, int size, const Tensor& flat) {
  const int64_t n = flat.numel(), c = zero1_chunk(n, size);
  for (int r = 0; r < size; ++r) {
    const int64_t begin = std::min(n, r * c), len = std::min(n, begin + c) - begin;
    if (len > 0) flat.narrow0(begin, len).copy_from(all.narrow0(r * per_rank + at, len));
  }
}
}  // namespace

ShardedUnits::ShardedUnits(std::vector<std::vector<Tensor>> units, Communicator& dp,
                           bool prefetch, const std::vector<Tensor>& experts, Communicator* edp,
                           const std::vector<Tensor>& copy_part, DType copy_dtype)
    : prefetch_(prefetch), copy_dtype_(copy_dtype), dp_(dp) {
  std::unordered_set<const TensorImpl*> is_expert, into_copy;
  for (const Tensor& e : experts) is_expert.insert(e.impl());
  for (const Tensor& c : copy_part) into_copy.insert(c.impl());
  if (!experts.empty() && !edp)
    throw std::logic_error("ZeRO-3: experts to shard but no expert data-parallel group");
  for (auto& params : units) {
    Unit unit;
    for (Tensor& p : params) {
      if (p.impl()->offset_bytes != 0 || p.impl()->storage->bytes() != p.nbytes())
        throw std::logic_error("ZeRO-3: parameter " + describe(p) + " is a view into a larger storage");
      where_[p.impl()] = {units_.size(), unit.members.size()};
      Communicator* comm = is_expert.count(p.impl()) ? edp : &dp_;
      const bool copy = into_copy.count(p.impl()) > 0;
      auto group = std::find_if(unit.groups.begin(), unit.groups.end(), [&](const Group& g) {
        return g.comm == comm && g.copies == copy;
      });
      if (group == unit.groups.end()) {
        unit.groups.emplace_back();
        group = unit.groups.end() - 1;
        group->comm = comm;
        group->copies = copy;
      }
      const auto [begin, end] = zero1_owned(p.numel(), comm->rank(), comm->size());
      unit.members.push_back({p, Tensor::empty({end - begin}, p.dtype(), p.device()), comm,
                              group->chunk_total, copy});
      group->chunk_total += zero1_chunk(p.numel(), comm->size());
    }
    units_.push_back(std::move(unit));
  }
  if (!copy_part.empty()) check_same_split(experts.empty() ? nullptr : edp);
  for (Unit& unit : units_) {
    take_owned(unit);
    unit.gathered = unit.masters_whole = true;
  }
  release_all();
}

// The gathers of a unit must match on every rank of a group: the same members in the copy
// part everywhere (else the buffers' lengths differ and the all-gathers mix f32 and bf16).
// One all-reduce a group, here at construction, before any gather.
void ShardedUnits::check_same_split(Communicator* edp) {
  Device device = Device::CPU;  // the members' (a pipeline stage may hold no outer unit)
  for (const Unit& unit : units_)
    if (!unit.members.empty()) {
      device = unit.members.front().param.device();
      break;
    }
  for (Communicator* comm : {&dp_, edp}) {
    if (!comm || comm->size() == 1) continue;
    std::vector<double> mine;  // per unit: its copy part's elements over comm
    for (const Unit& unit : units_) {
      int64_t n = 0;
      for (const Member& m : unit.members)
        if (m.group == comm && m.into_copy) n += m.param.numel();
      mine.push_back(static_cast<double>(n));
    }
    const size_t k = mine.size();
    std::vector<double> both = mine;  // max of n and of -n: the largest and smallest
    for (double n : mine) both.push_back(-n);
    Tensor t = Tensor::from_vector(both, {static_cast<int64_t>(2 * k)}, DType::F64).to(device);
    comm->all_reduce(t, ReduceOp::Max);
    const std::vector<double> got = t.to(Device::CPU).to_vector();
    for (size_t u = 0; u < k; ++u)
      if (got[u] != -got[k + u])
        throw std::logic_error(
            "ZeRO-3: unit " + std::to_string(u) + " gathers " +
            std::to_string(static_cast<int64_t>(mine[u])) + " elements into weight copies over " +
            comm->name() + " rank " + std::to_string(comm->rank()) + ", but from " +
            std::to_string(static_cast<int64_t>(-got[k + u])) + " to " +
            std::to_string(static_cast<int64_t>(got[u])) +
            " across the group: every rank must split its units alike");
  }
}

void ShardedUnits::take_owned(Unit& unit) {
  for (Member& m : unit.members) {
    const auto [begin, end] = zero1_owned(m.param.numel(), m.group->rank(), m.group->size());
    if (end > begin) m.owned.copy_from(m.param.view({m.param.numel()}).narrow0(begin, end - begin));
  }
}

void ShardedUnits::start_gather(size_t u, bool masters) {
  Unit& unit = units_[u];
  if (in_flight(u)) {
    if (unit.in_flight_as_masters == masters) return;
    wait_gathers(unit);  // a prefetch of the other kind: every rank started it, so finish it
  }
  const Tensor& first = unit.members.front().param;
  for (Group& g : unit.groups) {
    // The copy part travels in the copies' dtype, converted from the owned f32 slices (each
    // element as converting the whole master would: the same bits); gather_all's in f32.
    const DType dtype = g.copies && !masters ? copy_dtype_ : first.dtype();
    // send [L]: each member's owned slice at its chunk's offset (the padding is never read).
    g.send = Tensor::empty({g.chunk_total}, dtype, first.device());
    for (const Member& m : unit.members) {
      if (m.group != g.comm || m.into_copy != g.copies || m.owned.numel() == 0) continue;
      Tensor slot = g.send.narrow0(m.at, m.owned.numel());
      if (dtype == m.owned.dtype())
        slot.copy_from(m.owned);
      else
        backend_of(m.owned).convert(m.owned, slot);
    }
    g.all = Tensor::empty({g.comm->size() * g.chunk_total}, dtype, first.device());
    g.work = g.comm->all_gather_async(g.send, g.all);
    (masters ? gathered_bytes_.masters : g.copies ? gathered_bytes_.copies : gathered_bytes_.f32) +=
        g.all.nbytes();
  }
  unit.in_flight_as_masters = masters;
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
  for (Group& g : unit.groups) g.send = g.all = Tensor();
}

void ShardedUnits::prefetch(size_t u) {
  if (u >= units_.size() || units_[u].members.empty() || units_[u].gathered) return;
  start_gather(u, /*masters=*/false);
}

void ShardedUnits::gather(size_t u, bool masters) {
  Unit& unit = units_[u];
  if (unit.members.empty()) return;
  start_gather(u, masters);
  std::vector<Tensor> received;  // each group's receive buffer, kept past wait_gathers
  for (Group& g : unit.groups) received.push_back(g.all);
  wait_gathers(unit);
  for (size_t k = 0; k < unit.groups.size(); ++k) {
    const Group& g = unit.groups[k];
    const bool into_copies = g.copies && !masters;
    for (Member& m : unit.members) {
      if (m.group != g.comm || m.into_copy != g.copies) continue;
      if (into_copies) {
        // The copy written from the received bf16 slices and current at the master's stamp:
        // weight_copy_for hands it out, never reading the master, which stays released.
        m.param.impl()->storage->resize(0);  // whole only under gather_all
        Tensor copy = weight_copy_to_write(m.param, copy_dtype_);
        copy.impl()->storage->resize(copy.nbytes());
        copy.impl()->storage->set_label(m.param.impl()->storage->label() + " (weight copy)");
        unpack(received[k], g.chunk_total, m.at, g.comm->size(), copy.view({copy.numel()}));
        mark_copy_current(m.param);
        continue;
      }
      m.param.impl()->storage->resize(m.param.nbytes());  // a parameter spans its storage
      unpack(received[k], g.chunk_total, m.at, g.comm->size(), m.param.view({m.param.numel()}));
      // Its copy rewritten from the gathered master: the copy part's allocated if need be
      // (gather_all: whole copies beside whole masters), any other's if a forward made it.
      WeightCopy* copy = allocated_copy(m.param);
      if (m.into_copy && !copy) {
        weight_copy_to_write(m.param, copy_dtype_);
        copy = allocated_copy(m.param);
      }
      if (copy) {
        copy->value.impl()->storage->resize(copy->value.nbytes());
        backend_of(m.param).convert(m.param, copy->value);
        mark_written_with_copy(m.param);
      }
    }
  }
  unit.gathered = true;
  unit.masters_whole = masters || std::none_of(unit.members.begin(), unit.members.end(),
                                               [](const Member& m) { return m.into_copy; });
  unit.pending = static_cast<int>(unit.members.size());
}

void ShardedUnits::release(size_t u) {
  Unit& unit = units_[u];
  // Its buffers must outlive the collective, which every rank has started.
  if (in_flight(u)) wait_gathers(unit);
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
  for (size_t u = 0; u < units_.size(); ++u) gather(u, /*masters=*/true);
  all_whole_ = true;
}

void ShardedUnits::reshard_all() {
  for (Unit& unit : units_)
    if (unit.gathered && unit.masters_whole) take_owned(unit);
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

LeafGradReady ShardedUnits::release_hook(bool keep_outer) {
  return [this, keep_outer](const Tensor& leaf) {
    auto it = where_.find(leaf.impl());
    if (all_whole_ || it == where_.end() || (keep_outer && it->second.first == 0)) return;
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
