// Recompute regions (see recompute.h): the forward under NoGradGuard, one node per region whose
// backward reruns fn and runs the inner backward, and the costly-output store of selective
// recomputation.
#include "core/recompute.h"

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "core/autograd.h"

namespace mod {

namespace {
// The costly op outputs one region's forward made, in order; the recomputation reads them back.
struct KeptOutputs {
  std::vector<std::pair<Op, std::vector<Tensor>>> entries;
  size_t next = 0;
};

thread_local bool g_in_region = false;
thread_local KeptOutputs* g_keeping = nullptr;
thread_local KeptOutputs* g_replaying = nullptr;

// The thread's region state for one scope (a region's forward or its recomputation).
class RegionScope {
 public:
  RegionScope(KeptOutputs* keeping, KeptOutputs* replaying)
      : in_region_(g_in_region), keeping_(g_keeping), replaying_(g_replaying) {
    g_in_region = true;
    g_keeping = keeping;
    g_replaying = replaying;
  }
  ~RegionScope() {
    g_in_region = in_region_;
    g_keeping = keeping_;
    g_replaying = replaying_;
  }
  RegionScope(const RegionScope&) = delete;
  RegionScope& operator=(const RegionScope&) = delete;

 private:
  bool in_region_;
  KeptOutputs *keeping_, *replaying_;
};

// Reports the parameters an op is given to one region's forward, for one scope.
class LeafObserverScope {
 public:
  explicit LeafObserverScope(LeafSeen* observer) : previous_(set_leaf_observer(observer)) {}
  ~LeafObserverScope() { set_leaf_observer(previous_); }
  LeafObserverScope(const LeafObserverScope&) = delete;
  LeafObserverScope& operator=(const LeafObserverScope&) = delete;

 private:
  LeafSeen* previous_;
};

// What a region's backward needs; shared by its node and its outputs' nodes.
struct Region {
  RegionFn fn;
  std::vector<Tensor> inputs;  // detached: the region keeps their data, not their history
  std::optional<DType> autocast;
  RegionKeeps keeps = RegionKeeps::InputsOnly;
  KeptOutputs kept;
  size_t n_params = 0;               // parameter edges after the input edges
  std::vector<Tensor> output_grads;  // set by the outputs' nodes, undefined where none came
};

// The region node's backward: rerun fn with grad on, backward from its outputs, and return the
// inputs' gradients (the parameters' went straight into their grad()).
std::vector<Tensor> recompute_backward(Region& r, const NeedsGrad& needs) {
  std::vector<Tensor> rerun(r.inputs.size());
  for (size_t i = 0; i < r.inputs.size(); ++i)
    rerun[i] = needs[i] ? detach(r.inputs[i]).set_requires_grad(true) : r.inputs[i];
  std::vector<Tensor> outputs;
  {
    EnableGradGuard grad;
    AutocastGuard autocast(r.autocast);
    RegionScope scope(nullptr, r.keeps == RegionKeeps::CostlyOpOutputs ? &r.kept : nullptr);
    outputs = r.fn(rerun);
    if (r.kept.next != r.kept.entries.size())
      throw std::logic_error(
          "recompute_region: the recomputation made " + std::to_string(r.kept.next) +
          " costly op outputs where the forward made " + std::to_string(r.kept.entries.size()) +
          " (the region's function is not deterministic)");
  }
  if (outputs.size() != r.output_grads.size())
    throw std::logic_error("recompute_region: the recomputation returned " +
                           std::to_string(outputs.size()) + " outputs, the forward " +
                           std::to_string(r.output_grads.size()));
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outputs.size(); ++k)
    if (r.output_grads[k].defined() && outputs[k].defined() && outputs[k].requires_grad()) {
      roots.push_back(outputs[k]);
      seeds.push_back(r.output_grads[k]);
    }
  r.fn = nullptr;
  r.kept.entries.clear();
  r.output_grads.clear();
  if (!roots.empty()) backward(roots, seeds);
  roots.clear();
  outputs.clear();

  std::vector<Tensor> grads(r.inputs.size() + r.n_params);
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (!needs[i]) continue;
    const Tensor& g = rerun[i].grad();
    grads[i] = g.defined()
                   ? g
                   : Tensor::zeros(r.inputs[i].shape(), r.inputs[i].dtype(), r.inputs[i].device());
  }
  r.inputs.clear();
  return grads;
}
}  // namespace

std::vector<Tensor> recompute_region(const RegionFn& fn, const std::vector<Tensor>& inputs,
                                     RegionKeeps keeps) {
  if (!grad_enabled() || g_in_region) return fn(inputs);
  auto region = std::make_shared<Region>();
  region->fn = fn;
  region->autocast = autocast_dtype();
  region->keeps = keeps;
  for (const Tensor& in : inputs) region->inputs.push_back(in.defined() ? detach(in) : Tensor());

  std::vector<std::shared_ptr<TensorImpl>> params;
  std::unordered_set<TensorImpl*> seen;
  LeafSeen observe = [&](const Tensor& leaf) {
    if (seen.insert(leaf.impl()).second) params.push_back(leaf.impl_ptr());
  };
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    LeafObserverScope observer(&observe);
    RegionScope scope(keeps == RegionKeeps::CostlyOpOutputs ? &region->kept : nullptr, nullptr);
    outputs = fn(region->inputs);
  }
  bool any_input = false;
  for (const Tensor& in : inputs) any_input = any_input || (in.defined() && in.requires_grad());
  if (!any_input && params.empty()) return outputs;  // nothing in it to differentiate

  // One node for the region: its inputs' edges, then one edge per parameter fn used.
  region->n_params = params.size();
  region->output_grads.resize(outputs.size());
  std::shared_ptr<Node> node =
      make_node(Op::Recompute, inputs, [region](const Tensor&, const NeedsGrad& needs) {
        return recompute_backward(*region, needs);
      });
  for (auto& p : params) {
    Edge e;
    e.leaf = std::move(p);
    e.leaf_filled_by_node = true;
    node->inputs.push_back(std::move(e));
    node->needs.push_back(false);
  }
  // Each output's node stores its gradient and orders the region's node after itself.
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !is_floating(outputs[k].dtype())) continue;
    outputs[k] = detach(outputs[k]);
    auto out_node = std::make_shared<Node>();
    out_node->op = Op::RecomputeOutput;
    Edge e;
    e.node = node;
    e.order_only = true;
    out_node->inputs.push_back(std::move(e));
    out_node->needs.push_back(true);
    out_node->backward = [region, k](const Tensor& g, const NeedsGrad&) {
      region->output_grads[k] = g;
      return std::vector<Tensor>(1);
    };
    outputs[k].impl()->grad_fn = std::move(out_node);
    outputs[k].impl()->requires_grad = true;
  }
  return outputs;
}

bool replay_costly_outputs(Op op, std::initializer_list<Tensor*> outputs) {
  KeptOutputs* kept = g_replaying;
  if (!kept) return false;
  if (kept->next >= kept->entries.size() || kept->entries[kept->next].first != op ||
      kept->entries[kept->next].second.size() != outputs.size())
    throw std::logic_error(std::string("recompute_region: the recomputation ran ") + op_name(op) +
                           " where the forward ran " +
                           (kept->next < kept->entries.size()
                                ? op_name(kept->entries[kept->next].first)
                                : "nothing more") +
                           " (the region's function is not deterministic)");
  std::vector<Tensor>& stored = kept->entries[kept->next++].second;
  size_t i = 0;
  for (Tensor* out : outputs) {
    *out = detach(stored[i]);  // a fresh handle: the op records its node on it
    stored[i++] = Tensor();
  }
  return true;
}

void keep_costly_outputs(Op op, std::initializer_list<Tensor> outputs) {
  if (g_keeping) g_keeping->entries.emplace_back(op, std::vector<Tensor>(outputs));
}

bool keeping_costly_outputs() { return g_keeping != nullptr; }

}  // namespace mod
