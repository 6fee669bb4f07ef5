// The Mixture-of-Depths routing primitives: per-row top-k, row gather and row scatter-add.
//   topk_rows(scores [B,T], k)          -> idx [B,k] (i64), ascending positions, ties to lower
//   gather_rows(x [B,T,D], idx [B,C])   -> [B,C,D]
//   scatter_add_rows(x [B,T,D], idx [B,C], src [B,C,D]) -> x with src rows added at idx
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mod {

Tensor topk_rows(const Tensor& scores, int64_t k);  // forward only
Tensor gather_rows(const Tensor& x, const Tensor& idx);
Tensor scatter_add_rows(const Tensor& x, const Tensor& idx, const Tensor& src);

}  // namespace mod
