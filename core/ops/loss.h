// Sigmoid binary cross-entropy with logits, mean over elements (the MoD causal-routing loss).
// targets are floats in [0, 1] with logits' shape; no gradient flows into targets.
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references, errors),
// tests/core/grad_cases_routing_loss.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor bce_with_logits(const Tensor& logits, const Tensor& targets);

}  // namespace mod
