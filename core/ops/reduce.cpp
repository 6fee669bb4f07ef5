// sum and mean to a scalar; backward broadcasts the scalar gradient back to the input's shape.
#include "core/ops/reduce.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {
Tensor reduce_all(Op op, const Tensor& x, double factor) {
  check::floating(op_name(op), x, "x");
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  Backend& be = backend_of(x);
  be.sum_all(x, out);
  if (factor != 1.0) be.scale(out, factor, out);
  if (any_requires_grad({x})) {
    record(out, op, {x}, [factor, shape = x.shape()](const Tensor& g, const NeedsGrad&) {
      // dx = factor * g everywhere: g broadcast over every element (Broadcast::Inner, inner 1).
      Tensor zeros = Tensor::zeros(shape, g.dtype(), g.device());
      Tensor dx = Tensor::empty(shape, g.dtype(), g.device());
      Backend& b = backend_of(g);
      b.binary(BinaryKind::Add, Broadcast::Inner, shape_numel(shape), 1, zeros, g, dx);
      if (factor != 1.0) b.scale(dx, factor, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}
}  // namespace

Tensor sum(const Tensor& x) { return reduce_all(Op::Sum, x, 1.0); }
Tensor mean(const Tensor& x) {
  return reduce_all(Op::Mean, x, x.numel() == 0 ? 0.0 : 1.0 / static_cast<double>(x.numel()));
}

}  // namespace mod
