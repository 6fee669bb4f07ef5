// Autograd engine: node recording, topological backward and gradient accumulation.
#include "core/autograd.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/backend.h"

namespace mod {

namespace {
thread_local bool g_grad_enabled = true;
thread_local std::optional<DType> g_autocast;
thread_local LeafSeen* g_leaf_observer = nullptr;

// acc += g. In place when the engine holds acc's only reference (the common case: a fresh
// gradient from a node's backward); otherwise acc may alias a tensor the engine does not own
// (Add passes one gradient to both inputs, a view shares storage), so the sum is a new tensor.
// The copy was 35 memcpys a tiny_dense step (1.5% of it).
Tensor accumulate(Tensor acc, const Tensor& g) {
  if (!acc.sole_owner() || acc.requires_grad()) acc = acc.clone();
  backend_of(acc).axpy(1.0, g, acc);
  return acc;
}

void check_grad_shape(const Node& node, const Tensor& g, const Shape& expected) {
  if (g.shape() != expected)
    throw std::logic_error(std::string("backward of ") + op_name(node.op) +
                           " returned a gradient of shape " + shape_str(g.shape()) +
                           " for an input of shape " + shape_str(expected));
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }

const Tensor* accumulating_leaf_grad(const Tensor& leaf, const Tensor& grad_out) {
  if (!leaf.defined() || !leaf.requires_grad() || leaf.grad_fn()) return nullptr;
  const Tensor& acc = leaf.grad();
  return acc.defined() && acc.dtype() == grad_out.dtype() && acc.device() == grad_out.device()
             ? &acc
             : nullptr;
}

namespace {
// The node whose backward rule is running and the engine's gradients, for
// accumulating_input_grad; saved and restored around each rule (a recompute region's rule runs
// an engine of its own).
struct RunningRule {
  const Node* node = nullptr;
  std::unordered_map<Node*, Tensor>* grads = nullptr;
};
thread_local RunningRule g_running_rule;

class RunningRuleScope {
 public:
  RunningRuleScope(const Node* node, std::unordered_map<Node*, Tensor>* grads)
      : previous_(g_running_rule) {
    g_running_rule = {node, grads};
  }
  ~RunningRuleScope() { g_running_rule = previous_; }

 private:
  RunningRule previous_;
};
}  // namespace

Tensor* accumulating_input_grad(size_t input, DType dtype) {
  const RunningRule& r = g_running_rule;
  if (!r.node || !r.grads || input >= r.node->inputs.size()) return nullptr;
  const Edge& e = r.node->inputs[input];
  if (!e.node || e.leaf || e.order_only) return nullptr;
  auto it = r.grads->find(e.node.get());
  if (it == r.grads->end()) return nullptr;
  Tensor& acc = it->second;
  if (!acc.defined() || !acc.sole_owner() || acc.requires_grad() || acc.dtype() != dtype ||
      acc.shape() != e.shape)
    return nullptr;
  return &acc;
}

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : previous_(g_autocast) { g_autocast = dtype; }
AutocastGuard::~AutocastGuard() { g_autocast = previous_; }
std::optional<DType> autocast_dtype() { return g_autocast; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { g_grad_enabled = previous_; }

LeafSeen* set_leaf_observer(LeafSeen* observer) {
  LeafSeen* previous = g_leaf_observer;
  g_leaf_observer = observer;
  return previous;
}

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (g_leaf_observer)
    for (const Tensor& t : inputs)
      if (t.defined() && t.requires_grad() && !t.grad_fn()) (*g_leaf_observer)(t);
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor detach(const Tensor& t) { return t.view(t.shape()); }

std::shared_ptr<Node> make_node(Op op, const std::vector<Tensor>& inputs, BackwardFn backward_fn) {
  auto node = std::make_shared<Node>();
  node->op = op;
  node->backward = std::move(backward_fn);
  node->inputs.reserve(inputs.size());
  node->needs.reserve(inputs.size());
  for (const Tensor& in : inputs) {
    Edge e;
    if (in.defined()) e.shape = in.shape();
    if (in.defined() && in.requires_grad()) {
      if (in.grad_fn())
        e.node = in.grad_fn();
      else
        e.leaf = in.impl_ptr();
    }
    node->needs.push_back(e.active());
    node->inputs.push_back(std::move(e));
  }
  return node;
}

void record(Tensor& output, Op op, const std::vector<Tensor>& inputs, BackwardFn backward_fn) {
  output.impl()->grad_fn = make_node(op, inputs, std::move(backward_fn));
  output.impl()->requires_grad = true;
}

void record_outputs(std::initializer_list<Tensor*> outputs, Op op,
                    const std::vector<Tensor>& inputs, MultiBackwardFn backward_fn) {
  // Filled by the outputs' nodes, which run first; undefined where no gradient came.
  auto grad_outs = std::make_shared<std::vector<Tensor>>(outputs.size());
  std::shared_ptr<Node> node =
      make_node(op, inputs, [grad_outs, fn = std::move(backward_fn)](const Tensor&,
                                                                     const NeedsGrad& needs) {
        const std::vector<Tensor> g = std::move(*grad_outs);
        grad_outs->clear();
        return fn(g, needs);
      });
  size_t k = 0;
  for (Tensor* out : outputs) {
    auto out_node = std::make_shared<Node>();
    out_node->op = op;
    Edge e;
    e.node = node;
    e.order_only = true;
    out_node->inputs.push_back(std::move(e));
    out_node->needs.push_back(true);
    out_node->backward = [grad_outs, k](const Tensor& g, const NeedsGrad&) {
      (*grad_outs)[k] = g;
      return std::vector<Tensor>(1);
    };
    out->impl()->grad_fn = std::move(out_node);
    out->impl()->requires_grad = true;
    ++k;
  }
}

void backward(const Tensor& root, const Tensor& seed_in, const LeafGradReady& on_leaf_ready) {
  if (!root.defined()) throw std::logic_error("backward: undefined tensor");
  if (!root.requires_grad())
    throw std::logic_error("backward: " + describe(root) +
                           " does not require grad (no parameter or input on its path "
                           "requires grad, or it was computed under NoGradGuard)");
  Tensor seed = seed_in;
  if (!seed.defined()) {
    if (root.numel() != 1)
      throw std::logic_error("backward: root " + describe(root) +
                             " is not a scalar; pass a seed gradient of the same shape");
    seed = Tensor::full(root.shape(), 1.0, root.dtype(), root.device());
  }
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{seed}, on_leaf_ready);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
              const LeafGradReady& on_leaf_ready) {
  if (roots.size() != seeds.size())
    throw std::logic_error("backward: " + std::to_string(roots.size()) + " roots but " +
                           std::to_string(seeds.size()) + " seeds");
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].defined() || !roots[i].requires_grad())
      throw std::logic_error("backward: root " + std::to_string(i) +
                             " is undefined or does not require grad");
    if (!seeds[i].defined() || seeds[i].shape() != roots[i].shape() ||
        seeds[i].dtype() != roots[i].dtype())
      throw std::logic_error("backward: seed " +
                             (seeds[i].defined() ? describe(seeds[i]) : std::string("undefined")) +
                             " does not match root " + describe(roots[i]));
  }

  // A gradient nothing else references (its handle, its storage, a whole buffer) becomes the
  // leaf's gradient as it is; anything shared is copied, since the leaf's gradient is updated
  // in place later. The copy was a memcpy of every parameter's gradient per step.
  auto accumulate_leaf = [](TensorImpl& leaf, const Tensor& g) {
    if (!leaf.grad.defined())
      leaf.grad = g.sole_owner() && !g.requires_grad() ? g : g.clone();
    else
      backend(leaf.device).axpy(1.0, g, leaf.grad);
  };

  // Reverse topological order by iterative post-order DFS, from each root in turn.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  for (const Tensor& root : roots) {
    Node* start = root.grad_fn().get();
    if (!start || !visited.insert(start).second) continue;
    std::vector<std::pair<Node*, size_t>> stack{{start, 0}};
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        Node* child = node->inputs[next++].node.get();
        if (child && visited.insert(child).second) stack.push_back({child, 0});
      } else {
        order.push_back(node);
        stack.pop_back();
      }
    }
  }

  // Contributions still to come per leaf, so on_leaf_ready fires after the last one.
  std::unordered_map<TensorImpl*, int> pending;
  if (on_leaf_ready) {
    for (Node* node : order)
      for (const Edge& e : node->inputs)
        if (e.leaf) ++pending[e.leaf.get()];
    for (const Tensor& root : roots)
      if (!root.grad_fn()) ++pending[root.impl()];
  }
  auto contributed = [&](const std::shared_ptr<TensorImpl>& leaf) {
    if (on_leaf_ready && --pending[leaf.get()] == 0) on_leaf_ready(Tensor(leaf));
  };

  std::unordered_map<Node*, Tensor> grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].grad_fn()) {  // a leaf root takes its seed directly
      accumulate_leaf(*roots[i].impl(), seeds[i]);
      contributed(roots[i].impl_ptr());
      continue;
    }
    auto [slot, fresh] = grads.try_emplace(roots[i].grad_fn().get(), seeds[i]);
    if (!fresh) slot->second = accumulate(std::move(slot->second), seeds[i]);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    if (node->released)
      throw std::logic_error(std::string("backward through ") + op_name(node->op) +
                             " a second time: its saved tensors were freed by the first "
                             "backward; run the forward again");
    auto found = grads.find(node);
    if (found == grads.end()) continue;  // unreachable: every listed node feeds a root
    Tensor g = std::move(found->second);
    grads.erase(found);
    std::vector<Tensor> input_grads;
    {
      RunningRuleScope running(node, &grads);
      input_grads = node->backward(g, node->needs);
    }
    node->backward = nullptr;
    node->released = true;
    if (input_grads.size() != node->inputs.size())
      throw std::logic_error(std::string("backward of ") + op_name(node->op) + " returned " +
                             std::to_string(input_grads.size()) + " gradients for " +
                             std::to_string(node->inputs.size()) + " inputs");
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& e = node->inputs[i];
      if (!e.active()) continue;
      if (e.order_only) {  // no gradient; the node still has to run
        grads.try_emplace(e.node.get(), Tensor());
        continue;
      }
      if (e.leaf_filled_by_node) {
        contributed(e.leaf);
        continue;
      }
      const Tensor& gi = input_grads[i];
      if (!gi.defined())
        throw std::logic_error(std::string("backward of ") + op_name(node->op) +
                               " gave no gradient for input " + std::to_string(i));
      check_grad_shape(*node, gi, e.shape);
      if (e.leaf) {
        // The leaf's own gradient back: the rule already added into it (accumulating_leaf_grad).
        if (gi.impl() != e.leaf->grad.impl()) accumulate_leaf(*e.leaf, gi);
        contributed(e.leaf);
      } else {
        auto [slot, fresh] = grads.try_emplace(e.node.get(), gi);
        if (!fresh) {
          if (!slot->second.defined())
            slot->second = gi;  // an order-only edge got there first
          else if (!slot->second.same(gi))  // the same: added in place (accumulating_input_grad)
            slot->second = accumulate(std::move(slot->second), gi);
        }
      }
    }
  }
}

}  // namespace mod
