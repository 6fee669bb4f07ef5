// The Mixture-of-Depths routing primitives (shape legend: B batch, T tokens, C selected rows per
// batch entry, D width). topk_rows is a selection and records nothing; gather_rows and
// scatter_add_rows are each other's backward.
#include "core/ops/routing.h"


#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {
// x [B,T,D] and idx_BC [B,C] with every entry in [0,T).
void check_rows(const char* op, const Tensor& x, const Tensor& idx_BC) {
  check::floating(op, x, "x");
  check::dim(op, x, 3, "x");
  check::index(op, idx_BC, "idx");
  check::same_device(op, x, "x", idx_BC, "idx");
  if (idx_BC.dim() != 2 || idx_BC.size(0) != x.size(0))
    check::fail(op, "idx " + shape_str(idx_BC.shape()) + " must be [B,C] with B = " +
                        std::to_string(x.size(0)) + " from x " + shape_str(x.shape()));
  check::indices_in_range(op, idx_BC, x.size(1), "idx");
}

// runs must split idx [B,C] into equal runs along C, with B = 1 where runs > 1.
void check_runs(const char* op, const Tensor& idx_BC, int64_t runs) {
  if (runs < 1 || idx_BC.size(1) % runs != 0 || (runs > 1 && idx_BC.size(0) != 1))
    check::fail(op, "runs = " + std::to_string(runs) + " must divide C of idx " +
                        shape_str(idx_BC.shape()) + " (and B must be 1 for runs > 1)");
}

// out[idx] += src, one run of idx at a time (see routing.h); src [1,C,D] where runs > 1.
void scatter_in_runs(const Tensor& idx, const Tensor& src, Tensor& out, int64_t runs) {
  if (runs == 1) return backend_of(out).scatter_add_rows(idx, src, out);
  const int64_t len = idx.size(1) / runs, d = src.size(2);
  const Tensor idx_runs = idx.view({runs, len}), src_runs = src.view({runs, len, d});
  for (int64_t r = 0; r < runs; ++r)
    backend_of(out).scatter_add_rows(idx_runs.narrow0(r, 1), src_runs.narrow0(r, 1), out);
}

}  // namespace

Tensor topk_rows(const Tensor& scores, int64_t k) {
  check::floating("topk", scores, "scores");
  check::dim("topk", scores, 2, "scores");
  const int64_t b = scores.size(0), t = scores.size(1);
  if (k < 1 || k > t)
    check::fail("topk", "k = " + std::to_string(k) + " must be in [1, T] with T = " +
                            std::to_string(t) + " from scores " + shape_str(scores.shape()));
  Tensor idx_BK = Tensor::empty({b, k}, DType::I64, scores.device());
  backend_of(scores).topk_rows(scores, k, idx_BK);
  return idx_BK;  // no node: a selection has no gradient
}

Tensor gather_rows(const Tensor& x, const Tensor& idx, int64_t runs) {
  check_rows("gather_rows", x, idx);
  check_runs("gather_rows", idx, runs);
  const int64_t b = x.size(0), t = x.size(1), d = x.size(2), c = idx.size(1);
  Tensor out_BCD = Tensor::empty({b, c, d}, x.dtype(), x.device());
  backend_of(x).gather_rows(x, idx, out_BCD);
  if (any_requires_grad({x})) {
    record(out_BCD, Op::GatherRows, {x}, [idx, b, t, d, runs](const Tensor& g, const NeedsGrad&) {
      // The rows straight into x's gradient so far, when the engine holds one (bit for bit
      // what a zero-filled scatter then the engine's sum give: 0 + g is g).
      if (Tensor* acc = accumulating_input_grad(0, g.dtype())) {
        scatter_in_runs(idx, g, *acc, runs);
        return std::vector<Tensor>{*acc};
      }
      Tensor dx_BTD = Tensor::zeros({b, t, d}, g.dtype(), g.device());
      scatter_in_runs(idx, g, dx_BTD, runs);
      return std::vector<Tensor>{dx_BTD};
    });
  }
  return out_BCD;
}

Tensor scatter_add_rows(const Tensor& x, const Tensor& idx, const Tensor& src, int64_t runs) {
  constexpr const char* kOp = "scatter_add_rows";
  check_rows(kOp, x, idx);
  check_runs(kOp, idx, runs);
  check::floating(kOp, src, "src");
  check::same_dtype_device(kOp, x, "x", src, "src");
  const Shape want = {x.size(0), idx.size(1), x.size(2)};
  if (src.shape() != want)
    check::fail(kOp, "src " + shape_str(src.shape()) + " must be [B,C,D] = " + shape_str(want) +
                         " from x " + shape_str(x.shape()) + " and idx " + shape_str(idx.shape()));
  Tensor out_BTD = x.clone();
  scatter_in_runs(idx, src, out_BTD, runs);
  if (any_requires_grad({x, src})) {
    record(out_BTD, Op::ScatterAddRows, {x, src},
           [idx, want](const Tensor& g, const NeedsGrad& needs) {
             Tensor dx, dsrc;
             if (needs[0]) dx = g;  // the identity path
             if (needs[1]) {        // each src row receives the gradient of the row it landed on
               dsrc = Tensor::empty(want, g.dtype(), g.device());
               backend_of(g).gather_rows(g, idx, dsrc);
             }
             return std::vector<Tensor>{dx, dsrc};
           });
  }
  return out_BTD;
}

Tensor scatter_gated_rows(const Tensor& x, const Tensor& idx, const Tensor& src,
                          const Tensor& gate) {
  constexpr const char* kOp = "scatter_gated_rows";
  check_rows(kOp, x, idx);
  check::floating(kOp, src, "src");
  check::floating(kOp, gate, "gate");
  check::same_dtype_device(kOp, x, "x", src, "src");
  check::same_dtype_device(kOp, x, "x", gate, "gate");
  const Shape want = {x.size(0), idx.size(1), x.size(2)};
  const Shape want_gate = {x.size(0), idx.size(1), 1};
  if (src.shape() != want || gate.shape() != want_gate)
    check::fail(kOp, "src " + shape_str(src.shape()) + " and gate " + shape_str(gate.shape()) +
                         " must be [B,C,D] = " + shape_str(want) + " and [B,C,1] = " +
                         shape_str(want_gate) + " from x " + shape_str(x.shape()) + " and idx " +
                         shape_str(idx.shape()));
  Tensor out_BTD = x.clone();
  backend_of(out_BTD).scatter_gated_rows(idx, src, gate, out_BTD);
  if (any_requires_grad({x, src, gate})) {
    record(out_BTD, Op::ScatterGatedRows, {x, src, gate},
           [idx, sv = detach(src), gv = detach(gate)](const Tensor& g, const NeedsGrad& needs) {
             Tensor dsrc, dgate;
             if (needs[1]) dsrc = Tensor::empty(sv.shape(), g.dtype(), g.device());
             if (needs[2]) dgate = Tensor::empty(gv.shape(), g.dtype(), g.device());
             if (needs[1] || needs[2])
               backend_of(g).scatter_gated_rows_backward(g, idx, sv, gv, dsrc, dgate);
             return std::vector<Tensor>{needs[0] ? g : Tensor(), dsrc, dgate};  // x: the identity
           });
  }
  return out_BTD;
}

}  // namespace mod
