// Reductions to a scalar (shape []), accumulated in double on the CPU.
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

}  // namespace mod
