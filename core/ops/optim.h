// The AdamW update, in place and outside autograd: m, v moments as param's shape and dtype.
#pragma once

#include "core/backend.h"
#include "core/tensor.h"

namespace mod {

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args);

}  // namespace mod
