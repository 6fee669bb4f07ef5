// The Mixture-of-Depths routing primitives: per-row top-k, row gather and row scatter-add.
//   topk_rows(scores [B,T], k)          -> idx [B,k] (i64), ascending positions, ties to lower
//                                          (NaN ranks below every number, so a diverged
//                                          router still selects and the loss reports it)
//   gather_rows(x [B,T,D], idx [B,C])   -> [B,C,D]
//   scatter_add_rows(x [B,T,D], idx [B,C], src [B,C,D]) -> x with src rows added at idx
//   scatter_gated_rows(x [B,T,D], idx [B,C], src [B,C,D], gate [B,C,1])
//                                       -> x with gate * src rows added at idx: a routed block's
//                                          gate multiply, scatter and residual add in one pass
//                                          over the C rows; equal bit for bit to
//                                          scatter_add_rows(x, idx, mul(src, gate))
// Tested by: tests/core/routing_loss_optim_test.cpp (against naive references, errors),
// tests/core/grad_cases_routing_loss.cpp (float64 gradients),
// tests/cuda/parity_attention_routing_test.cpp (CUDA against CPU); scatter_gated_rows also
// tests/core/scatter_gated_rows_test.cpp (against mul then scatter_add_rows, bitwise).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mod {

// Where an index repeats, scatter-adds (gather_rows' backward included) accumulate in an order
// a GPU leaves unspecified (atomics). `runs` > 1 says idx [1,C] is that many equal consecutive
// runs, each of distinct indices (an MoE expert's slots): the scatter then goes one run at a
// time, so repeats add in run order, the same on every device and every call.
Tensor topk_rows(const Tensor& scores, int64_t k);  // forward only
Tensor gather_rows(const Tensor& x, const Tensor& idx, int64_t runs = 1);
Tensor scatter_add_rows(const Tensor& x, const Tensor& idx, const Tensor& src, int64_t runs = 1);
Tensor scatter_gated_rows(const Tensor& x, const Tensor& idx, const Tensor& src,
                          const Tensor& gate);

}  // namespace mod
