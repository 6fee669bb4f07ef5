// gelu_mlp: two GEMMs with GELU in their epilogues forward, four GEMMs backward (one with the
// DGELU epilogue), each with the arguments matmul gives the same product, so a backend without
// fused GEMMs computes exactly the unfused ops.
#include "core/ops/mlp.h"

#include <string>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/gemm_args.h"
#include "core/recompute.h"

namespace mod {

namespace {

Tensor gemm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const GemmArgs g = gemm_args(a, b, ta, tb);
  Tensor c = Tensor::empty({g.m, g.n}, a.dtype(), a.device());
  backend_of(c).gemm(g, a, b, c);
  return c;
}

// A weight's gradient op(a)^T-style product [rows, cols], added in place into the leaf's gradient
// when it holds one (as matmul's dB), else new.
Tensor weight_grad(const Tensor& leaf, const Tensor& a, const Tensor& b, const Shape& shape) {
  const Tensor* acc = accumulating_leaf_grad(leaf, a);
  Tensor dw = acc ? *acc : Tensor::empty(shape, a.dtype(), a.device());
  Tensor dw2 = dw.view(shape);
  backend_of(a).gemm(gemm_args(a, b, true, false, true, acc != nullptr), a, b, dw2);
  return dw;
}

}  // namespace

Tensor gelu_mlp(const Tensor& x, const Tensor& w_up, const Tensor& w_down) {
  const char* op = op_name(Op::GeluMlp);
  check::floating(op, x, "x");
  check::same_dtype_device(op, x, "x", w_up, "w_up");
  check::same_dtype_device(op, x, "x", w_down, "w_down");
  if (x.dim() < 2 || w_up.dim() != 2 || w_down.dim() != 2 || w_up.size(1) != x.size(-1) ||
      w_down.size(0) != x.size(-1) || w_down.size(1) != w_up.size(0))
    check::fail(op, "x " + shape_str(x.shape()) + ", w_up " + shape_str(w_up.shape()) +
                        ", w_down " + shape_str(w_down.shape()) +
                        ": expected x [..., D], w_up [F, D] and w_down [D, F]");
  const int64_t d = x.size(-1), f = w_up.size(0), n = x.numel() / d;
  const Tensor x2 = x.view({n, d});
  Tensor pre, h, y;
  // Selective recomputation hands back the GEMMs' products and GELU is redone from pre with the
  // GELU kernel, so a keeping forward computes h that way too: the epilogue's GELU of the f32
  // accumulator differs from it by an ulp in bf16, and backward's dW_down must see the h the
  // forward used.
  if (replay_costly_outputs(Op::GeluMlp, {&pre, &y})) {
    h = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
    backend_of(pre).gelu_forward(pre, h);
  } else {
    h = Tensor::empty({n, f}, x.dtype(), x.device());
    if (keeping_costly_outputs()) {
      pre = gemm(x2, w_up, false, true);
      backend_of(pre).gelu_forward(pre, h);
    } else {
      pre = Tensor::empty({n, f}, x.dtype(), x.device());
      backend_of(x).gemm_gelu(gemm_args(x2, w_up, false, true), x2, w_up, pre, h);
    }
    y = gemm(h, w_down, false, true);
    keep_costly_outputs(Op::GeluMlp, {pre, y});
  }
  Shape out_shape = x.shape();
  Tensor out = y.view(out_shape);

  if (any_requires_grad({x, w_up, w_down})) {
    // A weight read as it is (a leaf) may have its gradient added in place (as matmul's dB).
    const Tensor up_leaf = w_up.grad_fn() ? Tensor() : w_up;
    const Tensor down_leaf = w_down.grad_fn() ? Tensor() : w_down;
    record(out, Op::GeluMlp, {x, w_up, w_down},
           [x2, up = w_up.view(w_up.shape()), down = w_down.view(w_down.shape()), pre, h, up_leaf,
            down_leaf, out_shape](const Tensor& g, const NeedsGrad& needs) {
             const Tensor dy = g.view({x2.size(0), down.size(0)});
             std::vector<Tensor> grads(3);
             if (needs[0] || needs[1]) {
               // dpre = (dy W_down) * gelu'(pre), one GEMM with the derivative in its epilogue.
               Tensor dpre = Tensor::empty(pre.shape(), g.dtype(), g.device());
               backend_of(g).gemm_dgelu(gemm_args(dy, down, false, false), dy, down, pre, dpre);
               if (needs[0]) grads[0] = gemm(dpre, up, false, false).view(out_shape);
               if (needs[1]) grads[1] = weight_grad(up_leaf, dpre, x2, up.shape());
             }
             if (needs[2]) grads[2] = weight_grad(down_leaf, dy, h, down.shape());
             return grads;
           });
  }
  return out;
}

}  // namespace mod
