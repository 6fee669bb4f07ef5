// Embedding lookup: ids [...] (i32/i64) into table [V,D] -> [..., D]. Out-of-range ids throw.
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references, errors),
// tests/core/grad_cases_routing_loss.cpp (float64 gradients),
// tests/cuda/parity_nn_test.cpp (CUDA against CPU).
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor embedding(const Tensor& ids, const Tensor& table);

}  // namespace mod
