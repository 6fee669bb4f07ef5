// Define-by-run autograd. An op computes its output and, when grad mode is on and an input
// requires grad, records a Node holding its backward rule. backward() walks the nodes in reverse
// topological order and accumulates into leaves' grad().
//
// Invariants:
// - A Node references its inputs' nodes (or leaf tensors), never its own output: a backward rule
//   that needs the output saves output.detach(), which shares data but not history (no cycles).
// - A backward rule returns fresh tensors (or grad_out itself); the engine never writes into a
//   gradient it did not allocate, so aliasing grad_out is safe. One exception, by contract: a
//   rule may add a leaf's gradient into that leaf's existing grad() in place and return grad()
//   itself, which the engine then does not add again (accumulating_leaf_grad, below); likewise
//   for a non-leaf input's gradient that the engine alone holds (accumulating_input_grad).
// - After backward a node's saved tensors are freed; a second backward through it is an error.
// - An op with several outputs (record_outputs) gets one node per output, each of which passes
//   its gradient to the op's node along an order-only edge; the op's rule sees them all at once.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/op_catalogue.h"
#include "core/tensor.h"

namespace mod {

bool grad_enabled();

// Mixed precision: inside this scope layers compute in `dtype` (bf16 on GPUs): nn::Linear,
// Embedding and the norms cast their parameters and inputs with autocast() (core/ops), and the
// casts' backward brings gradients back to the parameters' own dtype (f32 masters). Losses are
// computed in f32 by the model. Per thread, like NoGradGuard.
// A state captured earlier with autocast_dtype() can be restored with it (none: f32 as stored),
// as a recompute region's recomputation does.
class AutocastGuard {
 public:
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};
std::optional<DType> autocast_dtype();  // none outside any AutocastGuard


// Inside this scope no op records a node (evaluation, optimizer steps, sampling).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Inside this scope ops record nodes again (a recompute region's recomputation in backward).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Which inputs of a node want a gradient; backward rules skip the work for the others.
using NeedsGrad = std::vector<bool>;
// Given d(loss)/d(output), returns d(loss)/d(input) per input (undefined where not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_out, const NeedsGrad&)>;

struct Edge {
  std::shared_ptr<Node> node;        // the input's producer, or
  std::shared_ptr<TensorImpl> leaf;  // the input itself when it is a leaf requiring grad
  Shape shape;                       // the input's shape, to check what backward returns
  // Recompute regions (core/recompute.h) only: the edge orders `node` after this node and
  // carries no gradient; or the node's own backward accumulates into `leaf` and the engine only
  // counts the edge for on_leaf_ready.
  bool order_only = false;
  bool leaf_filled_by_node = false;
  bool active() const { return node || leaf; }
};

struct Node {
  Op op;
  std::vector<Edge> inputs;
  NeedsGrad needs;
  BackwardFn backward;  // reset after it ran: frees saved tensors
  bool released = false;
};

// True when grad mode is on and any input requires grad: the op must record a node.
bool any_requires_grad(std::initializer_list<Tensor> inputs);

// Gradient-accumulation fusion (Megatron-LM's gradient_accumulation_fusion): for `leaf`, a
// parameter an op reads as it is, the gradient it already holds (every micro-batch after a
// step's first) when that gradient has grad_out's dtype and device, else null. A backward rule
// may add its contribution into it in place and return it (see the invariants above): matmul's
// weight and embedding's table do, saving a pass over the parameter's gradient per micro-batch.
const Tensor* accumulating_leaf_grad(const Tensor& leaf, const Tensor& grad_out);

// The same for an input that is not a leaf, from inside a backward rule: the gradient the engine
// already holds for input `input` of the node whose rule is running (other consumers' sum so
// far), when the engine is its only owner and it has `dtype`; else null (no gradient yet, or a
// shared one). The rule may add its contribution into it in place and return it; the engine
// then does not add it again. A rule that adds rows, a rank-1 term or a GEMM's product (beta =
// 1) this way skips a separate full-size gradient and the engine's pass summing it (MoD's
// gather and router, matmul's dA).
Tensor* accumulating_input_grad(size_t input, DType dtype);

// Attaches a node for `op` to `output` (call only when any_requires_grad(inputs)).
void record(Tensor& output, Op op, const std::vector<Tensor>& inputs, BackwardFn backward);
// The node record() attaches, unattached (recompute regions attach it to several outputs).
std::shared_ptr<Node> make_node(Op op, const std::vector<Tensor>& inputs, BackwardFn backward);

// An op with several outputs (add_rmsnorm: the sum and its norm). Given each output's gradient,
// undefined where none reached that output, returns d(loss)/d(input) per input.
using MultiBackwardFn =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outs, const NeedsGrad&)>;
// Ties `outputs` to one node for `op` (call only when any_requires_grad(inputs)). Each output
// gets a node of its own that hands its gradient over and orders the op's node after itself,
// so the op's backward runs once, after every output's gradient arrived (as a recompute
// region's does).
void record_outputs(std::initializer_list<Tensor*> outputs, Op op,
                    const std::vector<Tensor>& inputs, MultiBackwardFn backward);

// While one is installed, any_requires_grad() reports to it every leaf requiring grad that an op
// is given, grad mode on or off: a recompute region learns which parameters it uses from a
// forward that records nothing. Per thread; installing returns the previous one.
using LeafSeen = std::function<void(const Tensor& leaf)>;
LeafSeen* set_leaf_observer(LeafSeen* observer);

// Called once per leaf when backward has finished accumulating into its grad(): the leaf gets
// no more contributions from this backward. Data-parallel gradient buckets start their
// all-reduce from it while the rest of backward runs.
using LeafGradReady = std::function<void(const Tensor& leaf)>;

// Runs backward from root. A scalar root gets seed 1; a non-scalar root needs a seed of its shape.
void backward(const Tensor& root, const Tensor& seed = Tensor(),
              const LeafGradReady& on_leaf_ready = nullptr);
// One backward from several roots at once, each with its seed (defined, of the root's shape and
// dtype): every node runs once, after all its gradients arrived. Roots are walked in the order
// given, so nodes run in the order a backward from a sum of the roots would run them.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& seeds,
              const LeafGradReady& on_leaf_ready = nullptr);

// A tensor sharing root's data with no history (for saving outputs and for detaching inputs).
Tensor detach(const Tensor& t);

}  // namespace mod
