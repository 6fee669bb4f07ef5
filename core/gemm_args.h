// The GemmArgs (core/backend.h) of one product c = op(a) @ op(b) of row-major tensors, for the
// ops that call Backend::gemm (and its epilogue variants) directly: a is [M,K] or a batch
// [Bt,M,K] ([K,M] when ta), b is [K,N] ([N,K] when tb), shared over a's batch (stride 0) unless
// b_batched.
#pragma once

#include "core/backend.h"
#include "core/tensor.h"

namespace mod {

inline GemmArgs gemm_args(const Tensor& a, const Tensor& b, bool ta, bool tb,
                          bool b_batched = false, bool accumulate = false) {
  GemmArgs g;
  g.batch = a.dim() == 3 ? a.size(0) : 1;
  g.m = ta ? a.size(-1) : a.size(-2);
  g.k = ta ? a.size(-2) : a.size(-1);
  g.n = tb ? b.size(-2) : b.size(-1);
  g.trans_a = ta;
  g.trans_b = tb;
  g.stride_a = a.size(-2) * a.size(-1);
  g.stride_b = b_batched ? b.size(-2) * b.size(-1) : 0;
  g.stride_c = g.m * g.n;
  g.accumulate = accumulate;
  return g;
}

}  // namespace mod
