// Elementwise arithmetic, scale, bias add and reshape with their backward rules. A broadcast
// operand's gradient is the output gradient summed over the dims it was repeated along.
#include "core/ops/elementwise.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/weight_copy.h"

namespace mod {

namespace {

struct Layout {
  Broadcast bcast;
  int64_t outer, inner;
};

// How b lies against a (see elementwise.h); throws naming both shapes if it does not.
Layout broadcast_layout(const char* op, const Tensor& a, const Tensor& b) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const int64_t n = a.numel();
  if (as == bs) return {Broadcast::Same, 1, n};
  if (bs.size() <= as.size() && std::equal(bs.begin(), bs.end(), as.end() - bs.size())) {
    const int64_t inner = b.numel();
    return {Broadcast::Inner, inner == 0 ? 0 : n / inner, inner};
  }
  if (bs.size() == as.size()) {
    size_t k = 0;
    while (k < bs.size() && bs[k] == as[k]) ++k;
    bool ones = true;
    for (size_t i = k; i < bs.size(); ++i) ones = ones && bs[i] == 1;
    if (ones) {
      const int64_t outer = b.numel();
      return {Broadcast::Outer, outer, outer == 0 ? 0 : n / outer};
    }
  }
  check::fail(op, "cannot broadcast b " + shape_str(bs) + " against a " + shape_str(as) +
                      ": b must equal a's shape, a suffix of it, or a prefix padded with 1s");
}

// g summed down to b's shape under layout l.
Tensor reduce_to(const Tensor& g, const Layout& l, const Shape& b_shape) {
  if (l.bcast == Broadcast::Same) return g;
  Tensor out = Tensor::empty(b_shape, g.dtype(), g.device());
  if (l.bcast == Broadcast::Inner)
    backend_of(g).sum_outer(l.outer, l.inner, g, out);
  else
    backend_of(g).sum_inner(l.outer, l.inner, g, out);
  return out;
}

Tensor binary_op(Op op, BinaryKind kind, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check::floating(name, a, "a");
  check::floating(name, b, "b");
  check::same_dtype_device(name, a, "a", b, "b");
  const Layout l = broadcast_layout(name, a, b);
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  backend_of(out).binary(kind, l.bcast, l.outer, l.inner, a, b, out);
  if (any_requires_grad({a, b})) {
    const bool is_mul = kind == BinaryKind::Mul;
    Tensor sa = is_mul ? detach(a) : Tensor(), sb = is_mul ? detach(b) : Tensor();
    record(out, op, {a, b},
           [kind, l, sa, sb, b_shape = b.shape()](const Tensor& g, const NeedsGrad& needs) {
             Backend& be = backend_of(g);
             Tensor da, db;
             if (kind == BinaryKind::Mul) {
               if (needs[0]) {  // da = g * b (b broadcast as in the forward)
                 da = Tensor::empty(g.shape(), g.dtype(), g.device());
                 be.binary(BinaryKind::Mul, l.bcast, l.outer, l.inner, g, sb, da);
               }
               if (needs[1]) {  // db = sum over repeats of g * a
                 Tensor ga = Tensor::empty(g.shape(), g.dtype(), g.device());
                 be.binary(BinaryKind::Mul, Broadcast::Same, 1, g.numel(), g, sa, ga);
                 db = reduce_to(ga, l, b_shape);
               }
             } else {
               if (needs[0]) da = g;
               if (needs[1]) {
                 db = reduce_to(g, l, b_shape);
                 if (kind == BinaryKind::Sub) {
                   Tensor neg = Tensor::empty(db.shape(), db.dtype(), db.device());
                   be.scale(db, -1.0, neg);
                   db = neg;
                 }
               }
             }
             return std::vector<Tensor>{da, db};
           });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return binary_op(Op::Add, BinaryKind::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op(Op::Sub, BinaryKind::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op(Op::Mul, BinaryKind::Mul, a, b); }

Tensor bias_add(const Tensor& x, const Tensor& bias) {
  check::floating("bias_add", bias, "bias");
  check::floating("bias_add", x, "x");
  if (bias.dim() != 1 || x.dim() < 1 || bias.size(0) != x.size(-1))
    check::fail("bias_add", "bias " + shape_str(bias.shape()) + " must be [D] with D = x's last "
                            "dim, x is " + shape_str(x.shape()));
  return binary_op(Op::BiasAdd, BinaryKind::Add, x, bias);
}

Tensor scale(const Tensor& x, double alpha) {
  check::floating("scale", x, "x");
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_of(x).scale(x, alpha, out);
  if (any_requires_grad({x})) {
    record(out, Op::Scale, {x}, [alpha](const Tensor& g, const NeedsGrad&) {
      Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
      backend_of(g).scale(g, alpha, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

namespace {
// cast's backward: the gradient converted back to the source dtype.
BackwardFn cast_backward(DType from) {
  return [from](const Tensor& g, const NeedsGrad&) {
    Tensor dx = Tensor::empty(g.shape(), from, g.device());
    backend_of(g).convert(g, dx);
    return std::vector<Tensor>{dx};
  };
}
}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
  check::floating("cast", x, "x");
  if (!is_floating(dtype))
    check::fail("cast", std::string("target dtype must be floating, got ") + dtype_name(dtype));
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  backend_of(x).convert(x, out);
  if (any_requires_grad({x})) record(out, Op::Cast, {x}, cast_backward(x.dtype()));
  return out;
}

Tensor autocast(const Tensor& x) {
  const auto dtype = autocast_dtype();
  if (!dtype || !x.defined() || !is_floating(x.dtype()) || x.dtype() == *dtype) return x;
  // A parameter whose optimizer keeps a copy in dtype: the copy (current: weight_copy_for
  // rewrites a stale one) stands for cast(x), values and backward alike.
  if (const Tensor copy = weight_copy_for(x, *dtype); copy.defined()) {
    Tensor out = copy.view(copy.shape());  // its own node, the copy's storage
    if (any_requires_grad({x})) record(out, Op::Cast, {x}, cast_backward(x.dtype()));
    return out;
  }
  return cast(x, *dtype);
}

Tensor loss_precision(const Tensor& x) {
  return x.defined() && x.dtype() == DType::BF16 ? cast(x, DType::F32) : x;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  check::defined("reshape", x, "x");
  if (shape_numel(shape) != x.numel())
    check::fail("reshape", "cannot reshape " + shape_str(x.shape()) + " (" +
                               std::to_string(x.numel()) + " elements) to " + shape_str(shape));
  Tensor out = x.view(shape);
  if (any_requires_grad({x})) {
    record(out, Op::Reshape, {x}, [in_shape = x.shape()](const Tensor& g, const NeedsGrad&) {
      return std::vector<Tensor>{g.view(in_shape)};
    });
  }
  return out;
}

}  // namespace mod
