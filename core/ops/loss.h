// Sigmoid binary cross-entropy with logits, mean over elements (the MoD causal-routing loss).
// targets are floats in [0, 1] with logits' shape; no gradient flows into targets.
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor bce_with_logits(const Tensor& logits, const Tensor& targets);

}  // namespace mod
