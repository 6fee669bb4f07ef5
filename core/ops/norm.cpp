// RMSNorm and LayerNorm over the last dim. The wrappers view x [..., D] as rows [N,D], check that
// weight and bias are [D], and hand the per-row statistics the forward cached (rstd, mean) to
// the backward rule, which never recomputes them.
#include "core/ops/norm.h"

#include <cmath>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {

// x [..., D] with D > 0; returns N, the product of the leading dims.
int64_t check_rows(const char* op, const Tensor& x, double eps) {
  check::floating(op, x, "x");
  if (x.dim() < 1 || x.size(-1) == 0)
    check::fail(op, "x " + shape_str(x.shape()) + " needs a non-empty last dim to normalise");
  if (!(eps >= 0.0) || !std::isfinite(eps))
    check::fail(op, "eps must be finite and >= 0, got " + std::to_string(eps));
  return x.numel() / x.size(-1);
}

// p [D] with x's dtype and device, D = x's last dim.
void check_param(const char* op, const Tensor& x, const Tensor& p, const char* name) {
  check::floating(op, p, name);
  check::same_dtype_device(op, x, "x", p, name);
  if (p.dim() != 1 || p.size(0) != x.size(-1))
    check::fail(op, std::string(name) + " " + shape_str(p.shape()) +
                        " must be [D] with D = x's last dim; x is " + shape_str(x.shape()));
}

}  // namespace

Tensor rmsnorm(const Tensor& x, const Tensor& weight, double eps) {
  const char* op = op_name(Op::RMSNorm);
  const int64_t n = check_rows(op, x, eps), d = x.size(-1);
  check_param(op, x, weight, "weight");
  const Tensor x2 = x.view({n, d});  // a view: shares data, no history (safe to save)
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y2 = y.view({n, d});
  Tensor rstd = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  backend_of(x).rmsnorm_forward(x2, weight, eps, y2, rstd);
  if (any_requires_grad({x, weight})) {
    record(
        y, Op::RMSNorm, {x, weight},
        [x2, w = detach(weight), rstd, shape = x.shape()](const Tensor& g, const NeedsGrad& needs) {
          // The kernel produces both gradients in one pass; an unneeded one is dropped.
          Tensor dx = Tensor::empty(shape, g.dtype(), g.device());
          Tensor dx2 = dx.view(x2.shape());
          Tensor dw = Tensor::empty(w.shape(), g.dtype(), g.device());
          backend_of(g).rmsnorm_backward(g.view(x2.shape()), x2, w, rstd, dx2, dw);
          return std::vector<Tensor>{needs[0] ? dx : Tensor(), needs[1] ? dw : Tensor()};
        });
  }
  return y;
}

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const char* op = op_name(Op::LayerNorm);
  const int64_t n = check_rows(op, x, eps), d = x.size(-1);
  check_param(op, x, weight, "weight");
  check_param(op, x, bias, "bias");
  const Tensor x2 = x.view({n, d});
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y2 = y.view({n, d});
  Tensor mean = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  backend_of(x).layernorm_forward(x2, weight, bias, eps, y2, mean, rstd);
  if (any_requires_grad({x, weight, bias})) {
    record(y, Op::LayerNorm, {x, weight, bias},
           [x2, w = detach(weight), mean, rstd, shape = x.shape()](const Tensor& g,
                                                                   const NeedsGrad& needs) {
             Tensor dx = Tensor::empty(shape, g.dtype(), g.device());
             Tensor dx2 = dx.view(x2.shape());
             Tensor dw = Tensor::empty(w.shape(), g.dtype(), g.device());
             Tensor db = Tensor::empty(w.shape(), g.dtype(), g.device());
             backend_of(g).layernorm_backward(g.view(x2.shape()), x2, w, mean, rstd, dx2, dw, db);
             return std::vector<Tensor>{needs[0] ? dx : Tensor(), needs[1] ? dw : Tensor(),
                                        needs[2] ? db : Tensor()};
           });
  }
  return y;
}

}  // namespace mod
