// RMSNorm and LayerNorm over the last dim, alone or fused with the residual add before them. The
// wrappers view x [..., D] as rows [N,D], check that weight and bias are [D], and hand the
// per-row statistics the forward cached (rstd, mean) to the backward rule, which never
// recomputes them. The fused ops record one node for their two outputs (record_outputs).
#include "core/ops/norm.h"

#include <cmath>
#include <functional>
#include <vector>

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

// a has x's shape, dtype and device (the residual add, unbroadcast).
void check_addend(const char* op, const Tensor& x, const Tensor& a) {
  check::floating(op, a, "a");
  check::same_dtype_device(op, x, "x", a, "a");
  if (a.shape() != x.shape())
    check::fail(op, "a " + shape_str(a.shape()) + " must have x's shape " + shape_str(x.shape()));
}

// The gradient of both x and a: ds (what reached the sum from its other uses) plus the norm's
// dx, from the backend's fused kernel; ds alone when no gradient reached the normed output.
// g = {d sum, d normed}; inputs {x, a, weight (, bias)}; run_kernel calls the backend with the
// [N,D] views and n_params parameter gradients of weight's shape to fill.
using FusedBackward = std::function<void(const Tensor& dy, const Tensor& ds, Tensor& dx,
                                         std::vector<Tensor>& dparams)>;
std::vector<Tensor> add_norm_backward(const std::vector<Tensor>& g, const NeedsGrad& needs,
                                      const Shape& shape, const Tensor& w, size_t n_params,
                                      const FusedBackward& run_kernel) {
  const Tensor& ds = g[0];
  const Tensor& dy = g[1];
  std::vector<Tensor> grads(2 + n_params);
  if (!dy.defined()) {  // only the sum was used: x and a get its gradient, the parameters none
    for (size_t i = 0; i < 2; ++i)
      if (needs[i]) grads[i] = ds;
    for (size_t i = 2; i < grads.size(); ++i)
      if (needs[i]) grads[i] = Tensor::zeros(w.shape(), ds.dtype(), ds.device());
    return grads;
  }
  const int64_t d = shape.back(), n = shape_numel(shape) / d;
  Tensor dx = Tensor::empty(shape, dy.dtype(), dy.device());
  Tensor dx2 = dx.view({n, d});
  std::vector<Tensor> dparams;
  for (size_t i = 0; i < n_params; ++i)
    dparams.push_back(Tensor::empty(w.shape(), dy.dtype(), dy.device()));
  run_kernel(dy.view({n, d}), ds.defined() ? ds.view({n, d}) : Tensor(), dx2, dparams);
  for (size_t i = 0; i < 2; ++i)
    if (needs[i]) grads[i] = dx;
  for (size_t i = 0; i < n_params; ++i)
    if (needs[2 + i]) grads[2 + i] = dparams[i];
  return grads;
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

AddNorm add_rmsnorm(const Tensor& x, const Tensor& a, const Tensor& weight, double eps) {
  const char* op = op_name(Op::AddRMSNorm);
  const int64_t n = check_rows(op, x, eps), d = x.size(-1);
  check_addend(op, x, a);
  check_param(op, x, weight, "weight");
  AddNorm out{Tensor::empty(x.shape(), x.dtype(), x.device()),
              Tensor::empty(x.shape(), x.dtype(), x.device())};
  Tensor s2 = out.sum.view({n, d}), y2 = out.normed.view({n, d});
  Tensor rstd = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  backend_of(x).add_rmsnorm_forward(x.view({n, d}), a.view({n, d}), weight, eps, s2, y2, rstd);
  if (any_requires_grad({x, a, weight})) {
    // Saves the sum's data (a view without history: no cycle through its own node).
    record_outputs(
        {&out.sum, &out.normed}, Op::AddRMSNorm, {x, a, weight},
        [s2, w = detach(weight), rstd, shape = x.shape()](const std::vector<Tensor>& g,
                                                          const NeedsGrad& needs) {
          return add_norm_backward(
              g, needs, shape, w, 1,
              [&](const Tensor& dy, const Tensor& ds, Tensor& dx, std::vector<Tensor>& dp) {
                backend_of(dy).add_rmsnorm_backward(dy, ds, s2, w, rstd, dx, dp[0]);
              });
        });
  }
  return out;
}

AddNorm add_layernorm(const Tensor& x, const Tensor& a, const Tensor& weight, const Tensor& bias,
                      double eps) {
  const char* op = op_name(Op::AddLayerNorm);
  const int64_t n = check_rows(op, x, eps), d = x.size(-1);
  check_addend(op, x, a);
  check_param(op, x, weight, "weight");
  check_param(op, x, bias, "bias");
  AddNorm out{Tensor::empty(x.shape(), x.dtype(), x.device()),
              Tensor::empty(x.shape(), x.dtype(), x.device())};
  Tensor s2 = out.sum.view({n, d}), y2 = out.normed.view({n, d});
  Tensor mean = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  Tensor rstd = Tensor::empty({n}, stats_dtype(x.dtype()), x.device());
  backend_of(x).add_layernorm_forward(x.view({n, d}), a.view({n, d}), weight, bias, eps, s2, y2,
                                      mean, rstd);
  if (any_requires_grad({x, a, weight, bias})) {
    record_outputs(
        {&out.sum, &out.normed}, Op::AddLayerNorm, {x, a, weight, bias},
        [s2, w = detach(weight), mean, rstd, shape = x.shape()](const std::vector<Tensor>& g,
                                                                const NeedsGrad& needs) {
          return add_norm_backward(
              g, needs, shape, w, 2,
              [&](const Tensor& dy, const Tensor& ds, Tensor& dx, std::vector<Tensor>& dp) {
                backend_of(dy).add_layernorm_backward(dy, ds, s2, w, mean, rstd, dx, dp[0],
                                                      dp[1]);
              });
        });
  }
  return out;
}

}  // namespace mod
