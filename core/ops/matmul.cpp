// matmul: every case reduces to a batched GEMM on [Bt, rows, cols] views; backward is two more
// GEMMs with the transposes arranged so no transposed copy is ever made.
#include "core/ops/matmul.h"

#include <algorithm>
#include <string>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/gemm_args.h"
#include "core/recompute.h"

namespace mod {

namespace {
constexpr const char* kOp = "matmul";

// c [Bt,M,N] = op(a) [Bt,M,K] @ op(b) [Bt,K,N] (+ c when accumulate); a, b, c are 3-D views;
// b_batched=false shares b.
void bmm_into(const Tensor& a, const Tensor& b, bool ta, bool tb, bool b_batched, bool accumulate,
              Tensor& c) {
  backend_of(c).gemm(gemm_args(a, b, ta, tb, b_batched, accumulate), a, b, c);
}

Tensor bmm(const Tensor& a, const Tensor& b, bool ta, bool tb, bool b_batched) {
  Tensor c = Tensor::empty({a.size(0), ta ? a.size(2) : a.size(1), tb ? b.size(-2) : b.size(-1)},
                           a.dtype(), a.device());
  bmm_into(a, b, ta, tb, b_batched, false, c);
  return c;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check::floating(kOp, a, "a");
  check::floating(kOp, b, "b");
  check::same_dtype_device(kOp, a, "a", b, "b");
  const bool batched = a.dim() == 3 && b.dim() == 3;
  if (!batched && (b.dim() != 2 || a.dim() < 2))
    check::fail(kOp, "shapes " + shape_str(a.shape()) + " and " + shape_str(b.shape()) +
                         ": expected a [..., K] @ b [K,N] or a [Bt,M,K] @ b [Bt,K,N]");
  if (!batched && ta && a.dim() != 2)
    check::fail(kOp, "trans_a needs a 2-D a, got " + shape_str(a.shape()));
  if (batched && a.size(0) != b.size(0))
    check::fail(kOp, "batch sizes differ: a " + shape_str(a.shape()) + ", b " +
                         shape_str(b.shape()));
  const int64_t ka = ta ? a.size(-2) : a.size(-1);
  const int64_t kb = tb ? b.size(-1) : b.size(-2);
  if (ka != kb)
    check::fail(kOp, "inner dimensions differ: a " + shape_str(a.shape()) +
                         (ta ? "^T" : "") + " and b " + shape_str(b.shape()) + (tb ? "^T" : "") +
                         " (K " + std::to_string(ka) + " vs " + std::to_string(kb) + ")");

  // 3-D views: batched as is; otherwise a's leading dims flatten into M, one shared b.
  const Tensor a3 = batched ? a : a.view({1, a.numel() / a.size(-1), a.size(-1)});
  const Tensor b3 = batched ? b : b.view({1, b.size(0), b.size(1)});
  Shape out_shape = a.shape();
  if (batched || a.dim() == 2) out_shape[out_shape.size() - 2] = ta ? a.size(-1) : a.size(-2);
  out_shape.back() = tb ? b.size(-2) : b.size(-1);
  Tensor out;
  // Selective recomputation hands back the forward's product instead of redoing the GEMM.
  if (!replay_costly_outputs(Op::MatMul, {&out})) {
    out = bmm(a3, b3, ta, tb, batched).view(out_shape);
    keep_costly_outputs(Op::MatMul, {out});
  }

  if (any_requires_grad({a, b})) {
    // A shared 2-D b (a weight) may have its gradient added in place by dB's GEMM (beta = 1).
    const Tensor b_leaf = !batched && !b.grad_fn() ? b : Tensor();
    record(out, Op::MatMul, {a, b},
           [a3, b3, ta, tb, batched, b_leaf, a_shape = a.shape(), b_shape = b.shape()](
               const Tensor& g, const NeedsGrad& needs) {
             const Tensor g3 = g.view(
                 {a3.size(0), g.numel() / (a3.size(0) * g.size(-1)), g.size(-1)});
             Tensor da, db;
             if (needs[0]) {  // dA = dC op(B)^T, or op(B) dC^T when A was transposed
               // Added by the GEMM (beta = 1) into A's gradient so far when the engine holds
               // one: an activation feeding several GEMMs (the block's normed input feeds q, k
               // and v) gets no separate dA and no sum pass per further consumer.
               if (Tensor* acc = accumulating_input_grad(0, g.dtype())) {
                 Tensor acc3 = acc->view(a3.shape());
                 if (ta)
                   bmm_into(b3, g3, tb, true, true, true, acc3);
                 else
                   bmm_into(g3, b3, false, !tb, batched, true, acc3);
                 da = *acc;
               } else {
                 da = (ta ? bmm(b3, g3, tb, true, true) : bmm(g3, b3, false, !tb, batched))
                          .view(a_shape);
               }
             }
             if (needs[1]) {  // dB = op(A)^T dC, or dC^T op(A) when B was transposed
               const Tensor* acc = accumulating_leaf_grad(b_leaf, g);
               Tensor db3 =
                   acc ? acc->view(b3.shape()) : Tensor::empty(b3.shape(), g.dtype(), g.device());
               if (tb)
                 bmm_into(g3, a3, true, ta, true, acc != nullptr, db3);
               else
                 bmm_into(a3, g3, !ta, false, true, acc != nullptr, db3);
               db = acc ? *acc : db3.view(b_shape);
             }
             return std::vector<Tensor>{da, db};
           });
  }
  return out;
}

Tensor row_scores(const Tensor& x, const Tensor& w) {
  constexpr const char* op = "row_scores";
  check::floating(op, x, "x");
  check::floating(op, w, "w");
  check::same_device(op, x, "x", w, "w");
  if (x.dim() < 1 || w.dim() != 2 || w.size(0) != 1 || w.size(1) != x.size(-1))
    check::fail(op, "x " + shape_str(x.shape()) + " and w " + shape_str(w.shape()) +
                        ": expected x [..., D] and w [1, D]");
  if (dtype_size(x.dtype()) > dtype_size(w.dtype()))
    check::fail(op, std::string("x is ") + dtype_name(x.dtype()) + ", wider than w's " +
                        dtype_name(w.dtype()) + ": the scores are summed in w's dtype");
  const int64_t d = x.size(-1), n = x.numel() / std::max<int64_t>(d, 1);
  const Tensor x2 = x.view({n, d});
  Shape out_shape = x.shape();
  out_shape.back() = 1;
  Tensor out;
  if (!replay_costly_outputs(Op::RowScores, {&out})) {
    out = Tensor::empty(out_shape, w.dtype(), x.device());
    Tensor r = out.view({n});
    backend_of(x).row_scores_forward(x2, w.view({d}), r);
    keep_costly_outputs(Op::RowScores, {out});
  }
  if (any_requires_grad({x, w})) {
    const Tensor w_leaf = w.grad_fn() ? Tensor() : w;
    record(out, Op::RowScores, {x, w},
           [x2, w1 = w.view({d}), w_leaf, x_shape = x.shape(), w_shape = w.shape()](
               const Tensor& g, const NeedsGrad& needs) {
             const int64_t rows = x2.size(0), cols = x2.size(1);
             Tensor dx, dw, dw1;
             // dr w added straight into x's gradient so far, when the engine holds one.
             Tensor* dx_acc = needs[0] ? accumulating_input_grad(0, x2.dtype()) : nullptr;
             if (dx_acc)
               dx = dx_acc->view({rows, cols});
             else if (needs[0])
               dx = Tensor::empty({rows, cols}, x2.dtype(), g.device());
             const Tensor* acc = needs[1] ? accumulating_leaf_grad(w_leaf, g) : nullptr;
             if (needs[1]) {
               dw = acc ? *acc : Tensor::empty(w_shape, g.dtype(), g.device());
               dw1 = dw.view({cols});
             }
             backend_of(g).row_scores_backward(x2, w1, g.view({rows}), dx, dx_acc != nullptr,
                                               dw1, acc != nullptr);
             if (dx_acc) return std::vector<Tensor>{*dx_acc, dw};
             return std::vector<Tensor>{dx.defined() ? dx.view(x_shape) : Tensor(), dw};
           });
  }
  return out;
}

}  // namespace mod
