// Normalisations over the last dim. x [..., D], weight/bias [D]. The forward caches per-row
// statistics (rstd, and mean for LayerNorm) for the backward.
#pragma once

#include "core/tensor.h"

namespace mod {

// y = x / sqrt(mean(x^2) + eps) * weight
Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps = 1e-5);
// y = (x - mean) / sqrt(var + eps) * weight + bias
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace mod
