// matmul: every case reduces to a batched GEMM on [Bt, rows, cols] views; backward is two more
// GEMMs with the transposes arranged so no transposed copy is ever made.
#include "core/ops/matmul.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/recompute.h"

namespace mod {

namespace {
constexpr const char* kOp = "matmul";

// c [Bt,M,N] = op(a) [Bt,M,K] @ op(b) [Bt,K,N] (+ c when accumulate); a, b, c are 3-D views;
// b_batched=false shares b.
void bmm_into(const Tensor& a, const Tensor& b, bool ta, bool tb, bool b_batched, bool accumulate,
              Tensor& c) {
  GemmArgs g;
  g.batch = a.size(0);
  g.m = ta ? a.size(2) : a.size(1);
  g.k = ta ? a.size(1) : a.size(2);
  g.n = tb ? b.size(-2) : b.size(-1);
  g.trans_a = ta;
  g.trans_b = tb;
  g.stride_a = a.size(1) * a.size(2);
  g.stride_b = b_batched ? b.size(-2) * b.size(-1) : 0;
  g.stride_c = g.m * g.n;
  g.accumulate = accumulate;
  backend_of(c).gemm(g, a, b, c);
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
             if (needs[0])  // dA = dC op(B)^T, or op(B) dC^T when A was transposed
               da = (ta ? bmm(b3, g3, tb, true, true) : bmm(g3, b3, false, !tb, batched))
                        .view(a_shape);
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

}  // namespace mod
