// Autograd engine: node recording, topological backward and gradient accumulation.
#include "core/autograd.h"

#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "core/backend.h"

namespace mod {

namespace {
thread_local bool g_grad_enabled = true;
thread_local std::optional<DType> g_autocast;

// acc += g, allocating a new tensor: acc may alias a tensor the engine does not own.
Tensor add_out_of_place(const Tensor& acc, const Tensor& g) {
  Tensor out = acc.clone();
  backend_of(out).axpy(1.0, g, out);
  return out;
}

void check_grad_shape(const Node& node, const Tensor& g, const Shape& expected) {
  if (g.shape() != expected)
    throw std::logic_error(std::string("backward of ") + op_name(node.op) +
                           " returned a gradient of shape " + shape_str(g.shape()) +
                           " for an input of shape " + shape_str(expected));
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }

AutocastGuard::AutocastGuard(DType dtype) : previous_(g_autocast) { g_autocast = dtype; }
AutocastGuard::~AutocastGuard() { g_autocast = previous_; }
std::optional<DType> autocast_dtype() { return g_autocast; }

NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

bool any_requires_grad(std::initializer_list<Tensor> inputs) {
  if (!g_grad_enabled) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Tensor detach(const Tensor& t) { return t.view(t.shape()); }

void record(Tensor& output, Op op, const std::vector<Tensor>& inputs, BackwardFn backward_fn) {
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
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
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
  } else if (seed.shape() != root.shape() || seed.dtype() != root.dtype()) {
    throw std::logic_error("backward: seed " + describe(seed) + " does not match root " +
                           describe(root));
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

  if (!root.grad_fn()) {
    accumulate_leaf(*root.impl(), seed);
    if (on_leaf_ready) on_leaf_ready(root);
    return;
  }

  // Reverse topological order by iterative post-order DFS.
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<Node*, size_t>> stack{{root.grad_fn().get(), 0}};
  visited.insert(root.grad_fn().get());
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

  // Contributions still to come per leaf, so on_leaf_ready fires after the last one.
  std::unordered_map<TensorImpl*, int> pending;
  if (on_leaf_ready)
    for (Node* node : order)
      for (const Edge& e : node->inputs)
        if (e.leaf) ++pending[e.leaf.get()];

  std::unordered_map<Node*, Tensor> grads;
  grads[root.grad_fn().get()] = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    if (node->released)
      throw std::logic_error(std::string("backward through ") + op_name(node->op) +
                             " a second time: its saved tensors were freed by the first "
                             "backward; run the forward again");
    auto found = grads.find(node);
    if (found == grads.end()) continue;  // unreachable: every listed node feeds the root
    Tensor g = std::move(found->second);
    grads.erase(found);
    std::vector<Tensor> input_grads = node->backward(g, node->needs);
    node->backward = nullptr;
    node->released = true;
    if (input_grads.size() != node->inputs.size())
      throw std::logic_error(std::string("backward of ") + op_name(node->op) + " returned " +
                             std::to_string(input_grads.size()) + " gradients for " +
                             std::to_string(node->inputs.size()) + " inputs");
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& e = node->inputs[i];
      if (!e.active()) continue;
      const Tensor& gi = input_grads[i];
      if (!gi.defined())
        throw std::logic_error(std::string("backward of ") + op_name(node->op) +
                               " gave no gradient for input " + std::to_string(i));
      check_grad_shape(*node, gi, e.shape);
      if (e.leaf) {
        accumulate_leaf(*e.leaf, gi);
        if (on_leaf_ready && --pending[e.leaf.get()] == 0) on_leaf_ready(Tensor(e.leaf));
      } else {
        auto [slot, fresh] = grads.try_emplace(e.node.get(), gi);
        if (!fresh) slot->second = add_out_of_place(slot->second, gi);
      }
    }
  }
}

}  // namespace mod
