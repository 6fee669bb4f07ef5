// GELU (tanh approximation), SiLU and SwiGLU with their backward rules. Each backward needs only
// the forward's inputs, saved as detached views; outputs keep any shape.
#include "core/ops/activation.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {

using ForwardKernel = void (Backend::*)(const Tensor&, Tensor&);
using BackwardKernel = void (Backend::*)(const Tensor&, const Tensor&, Tensor&);

// y = f(x) pointwise; dx = f'(x) dy from the saved input.
Tensor pointwise(Op op, ForwardKernel forward, BackwardKernel backward, const Tensor& x) {
  check::floating(op_name(op), x, "x");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  (backend_of(x).*forward)(x, y);
  if (any_requires_grad({x})) {
    record(y, op, {x}, [backward, xs = detach(x)](const Tensor& g, const NeedsGrad&) {
      Tensor dx = Tensor::empty(xs.shape(), g.dtype(), g.device());
      (backend_of(g).*backward)(xs, g, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor gelu(const Tensor& x) {
  return pointwise(Op::GELU, &Backend::gelu_forward, &Backend::gelu_backward, x);
}

Tensor silu(const Tensor& x) {
  return pointwise(Op::SiLU, &Backend::silu_forward, &Backend::silu_backward, x);
}

Tensor sigmoid(const Tensor& x) {
  return pointwise(Op::Sigmoid, &Backend::sigmoid_forward, &Backend::sigmoid_backward, x);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  const char* op = op_name(Op::SwiGLU);
  check::floating(op, gate, "gate");
  check::floating(op, up, "up");
  check::same_dtype_device(op, gate, "gate", up, "up");
  check::same_shape(op, gate, "gate", up, "up");
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  backend_of(gate).swiglu_forward(gate, up, y);
  if (any_requires_grad({gate, up})) {
    record(y, Op::SwiGLU, {gate, up},
           [gs = detach(gate), us = detach(up)](const Tensor& g, const NeedsGrad& needs) {
             // One kernel writes both gradients; an unneeded one is dropped.
             Tensor dgate = Tensor::empty(gs.shape(), g.dtype(), g.device());
             Tensor dup = Tensor::empty(us.shape(), g.dtype(), g.device());
             backend_of(g).swiglu_backward(gs, us, g, dgate, dup);
             return std::vector<Tensor>{needs[0] ? dgate : Tensor(), needs[1] ? dup : Tensor()};
           });
  }
  return y;
}

}  // namespace mod
