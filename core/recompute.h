// Activation recomputation: a region of the graph whose intermediate tensors are not kept for
// backward but recomputed there (docs/recompute.md).
//
// recompute_region(fn, inputs) runs fn under NoGradGuard and records one node for the whole
// region. Its backward reruns fn with grad on (same autocast state as the forward) on detached
// copies of the inputs, runs one inner backward seeded with every output's gradient, and hands
// the inputs' gradients on. Invariants:
// - fn must compute the same thing twice: no randomness, no state it changes; what it reports
//   besides its outputs (statistics) must go to a place read once, after the forward.
// - Parameters fn uses are found in the forward (any_requires_grad sees them) and get their
//   gradients from the inner backward directly; the outer backward counts the region as one
//   contribution to each, so on_leaf_ready fires once, after the region's.
// - The region's backward runs once, after all its outputs' gradients arrived; an output that
//   gets none seeds nothing.
// - Regions do not nest: inside a region's forward or recomputation recompute_region() just
//   calls fn.
#pragma once

#include <functional>
#include <initializer_list>
#include <vector>

#include "core/op_catalogue.h"
#include "core/tensor.h"

namespace mod {

// What a region keeps besides its inputs. Inputs only: backward reruns all of fn. Costly op
// outputs: the outputs of GEMMs and attention made in the forward are kept and handed back to
// those ops when fn reruns, so the recomputation runs only the cheap ops between them (norms,
// RoPE, activations, adds, gathers) and drops their outputs (PyTorch's selective activation
// checkpointing).
enum class RegionKeeps { InputsOnly, CostlyOpOutputs };

using RegionFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// outputs = fn(inputs), differentiable with respect to inputs requiring grad and to parameters
// fn uses. Outside grad mode (or nested in a region) it is fn(inputs).
std::vector<Tensor> recompute_region(const RegionFn& fn, const std::vector<Tensor>& inputs,
                                     RegionKeeps keeps = RegionKeeps::InputsOnly);

// For ops whose outputs RegionKeeps::CostlyOpOutputs keeps (matmul, attention): in a keeping
// forward, keep_costly_outputs stores them; in the recomputation, replay_costly_outputs fills
// `outputs` with the stored ones (in the order they were made) and returns true, and the op
// skips its kernel but records its node as usual. Elsewhere both do nothing.
bool replay_costly_outputs(Op op, std::initializer_list<Tensor*> outputs);
void keep_costly_outputs(Op op, std::initializer_list<Tensor> outputs);
// True in a keeping forward: what an op computes besides its kept outputs will be recomputed
// from them, so it must compute it the way the recomputation will.
bool keeping_costly_outputs();

}  // namespace mod
