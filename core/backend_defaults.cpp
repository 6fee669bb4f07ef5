// What a backend runs for a composite kernel it has no fused version of: the ops it stands
// for, in their order, so such a backend's fused op equals the unfused ops bit for bit.
#include "core/backend.h"

#include "core/gemm_args.h"

namespace mod {

void Backend::gemm_gelu(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& pre,
                        Tensor& out) {
  gemm(args, a, b, pre);
  gelu_forward(pre, out);
}

void Backend::gemm_dgelu(const GemmArgs& args, const Tensor& a, const Tensor& b,
                         const Tensor& pre, Tensor& out) {
  gemm(args, a, b, out);
  gelu_backward(pre, out, out);  // elementwise, so dx may be dy
}

namespace {
// x converted to dtype (a copy when it has it already).
Tensor widened(Backend& be, const Tensor& x, DType dtype) {
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  if (x.dtype() == dtype)
    be.copy(x, out);
  else
    be.convert(x, out);
  return out;
}
}  // namespace

// The GEMMs matmul runs for linear(cast(x), w[1,D]) and its backward, with cast's conversions.
void Backend::row_scores_forward(const Tensor& x, const Tensor& w, Tensor& r) {
  const Tensor xw = widened(*this, x, w.dtype()), w2 = w.view({1, w.numel()});
  Tensor r2 = r.view({x.size(0), 1});
  gemm(gemm_args(xw, w2, false, true), xw, w2, r2);
}

void Backend::row_scores_backward(const Tensor& x, const Tensor& w, const Tensor& dr, Tensor& dx,
                                  bool accumulate_dx, Tensor& dw, bool accumulate_dw) {
  const int64_t n = x.size(0), d = x.size(1);
  const Tensor dr2 = dr.view({n, 1}), w2 = w.view({1, d});
  if (dx.defined()) {  // dx = dr w, in w's dtype, then rounded to x's
    Tensor wide = Tensor::empty({n, d}, w.dtype(), w.device());
    gemm(gemm_args(dr2, w2, false, false), dr2, w2, wide);
    Tensor rounded = accumulate_dx ? Tensor::empty({n, d}, dx.dtype(), dx.device()) : dx;
    if (dx.dtype() == w.dtype())
      copy(wide, rounded);
    else
      convert(wide, rounded);
    if (accumulate_dx) axpy(1.0, rounded, dx);  // the engine's sum of two gradients
  }
  if (dw.defined()) {  // dw (+)= dr^T x
    const Tensor xw = widened(*this, x, w.dtype());
    Tensor dw2 = dw.view({1, d});
    gemm(gemm_args(dr2, xw, true, false, true, accumulate_dw), dr2, xw, dw2);
  }
}

// mul(src, gate) (gate broadcast over each row), then scatter_add_rows.
void Backend::scatter_gated_rows(const Tensor& idx, const Tensor& src, const Tensor& gate,
                                 Tensor& out) {
  const int64_t rows = gate.numel();
  Tensor gated = Tensor::empty(src.shape(), src.dtype(), src.device());
  binary(BinaryKind::Mul, Broadcast::Outer, rows, rows == 0 ? 0 : src.numel() / rows, src, gate,
         gated);
  scatter_add_rows(idx, gated, out);
}

// scatter_add_rows' backward (the rows gathered), then mul's: dsrc = rows * gate, dgate = the
// row sums of rows * src.
void Backend::scatter_gated_rows_backward(const Tensor& dout, const Tensor& idx, const Tensor& src,
                                          const Tensor& gate, Tensor& dsrc, Tensor& dgate) {
  const int64_t rows = gate.numel(), d = rows == 0 ? 0 : src.numel() / rows;
  Tensor picked = Tensor::empty(src.shape(), src.dtype(), src.device());
  gather_rows(dout, idx, picked);
  if (dsrc.defined()) binary(BinaryKind::Mul, Broadcast::Outer, rows, d, picked, gate, dsrc);
  if (dgate.defined()) {
    Tensor products = Tensor::empty(src.shape(), src.dtype(), src.device());
    binary(BinaryKind::Mul, Broadcast::Same, 1, src.numel(), picked, src, products);
    sum_inner(rows, d, products, dgate);
  }
}

}  // namespace mod
