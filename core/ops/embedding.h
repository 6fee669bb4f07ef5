// Embedding lookup: ids [...] (i32/i64) into table [V,D] -> [..., D]. Out-of-range ids throw.
#pragma once

#include "core/tensor.h"

namespace mod {

Tensor embedding(const Tensor& ids, const Tensor& table);

}  // namespace mod
