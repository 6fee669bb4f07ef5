// bce_with_logits: mean over elements of the stable sigmoid cross-entropy (the MoD causal-routing
// loss). Only logits are recorded as an input: targets never receive a gradient.
// linear_cross_entropy: the LM head and its cross-entropy, chunked over rows; its forward makes
// the gradients (core/ops/loss.h says why) and its backward only scales them.
#include "core/ops/loss.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"
#include "core/ops/softmax.h"

namespace mod {

namespace {
constexpr const char* kOp = "bce_with_logits";
}  // namespace

Tensor bce_with_logits(const Tensor& logits, const Tensor& targets) {
  check::floating(kOp, logits, "logits");
  check::floating(kOp, targets, "targets");
  check::same_dtype_device(kOp, logits, "logits", targets, "targets");
  check::same_shape(kOp, logits, "logits", targets, "targets");
  const int64_t n = logits.numel();
  if (n == 0) check::fail(kOp, "logits " + shape_str(logits.shape()) + " is empty: no mean");

  Backend& be = backend_of(logits);
  Tensor losses = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  be.bce_with_logits_forward(logits, targets, losses);
  Tensor out = Tensor::empty({}, logits.dtype(), logits.device());
  be.sum_all(losses, out);
  be.scale(out, 1.0 / static_cast<double>(n), out);

  if (any_requires_grad({logits})) {
    record(out, Op::BCEWithLogits, {logits},
           [x = detach(logits), t = detach(targets), n](const Tensor& g, const NeedsGrad&) {
             Backend& b = backend_of(g);
             Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
             // g is a scalar: read it on the host, or multiply it in on the device.
             const bool host = g.device() == Device::CPU;
             b.bce_with_logits_backward(x, t, (host ? g.item() : 1.0) / static_cast<double>(n), dx);
             if (!host) b.binary(BinaryKind::Mul, Broadcast::Inner, n, 1, dx, g, dx);
             return std::vector<Tensor>{dx};
           });
  }
  return out;
}

int64_t linear_cross_entropy_chunk_rows(int64_t v, DType dtype) {
  const int64_t row_bytes = std::max<int64_t>(1, v) * static_cast<int64_t>(dtype_size(dtype));
  return std::max<int64_t>(1, kLinearCrossEntropyChunkBytes / row_bytes);
}

namespace {

// c = op(a) @ op(b) (+ c when accumulate), 2-D row-major; c may be f32 for bf16 a and b.
void gemm_2d(const Tensor& a, bool ta, const Tensor& b, bool tb, bool accumulate, Tensor& c) {
  GemmArgs g;
  g.m = c.size(0);
  g.n = c.size(1);
  g.k = ta ? a.size(0) : a.size(1);
  g.trans_a = ta;
  g.trans_b = tb;
  g.accumulate = accumulate;
  backend_of(c).gemm(g, a, b, c);
}

// grad * g (g a 0-d tensor of grad's dtype), in place, then rounded to `dtype`.
Tensor scaled_to(Tensor grad, const Tensor& g, DType dtype) {
  Backend& b = backend_of(grad);
  b.binary(BinaryKind::Mul, Broadcast::Inner, grad.numel(), 1, grad, g, grad);
  if (grad.dtype() == dtype) return grad;
  Tensor out = Tensor::empty(grad.shape(), dtype, grad.device());
  b.convert(grad, out);
  return out;
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            int64_t ignore_index, int64_t chunk_rows) {
  const char* op = op_name(Op::LinearCrossEntropy);
  check::floating(op, x, "x");
  check::floating(op, weight, "weight");
  check::same_dtype_device(op, x, "x", weight, "weight");
  check::index(op, targets, "targets");
  check::same_device(op, targets, "targets", x, "x");
  if (weight.dim() != 2 || weight.size(0) == 0)
    check::fail(op, "weight " + shape_str(weight.shape()) + " must be [V,D] with V > 0");
  if (x.dim() < 1 || x.size(-1) != weight.size(1))
    check::fail(op, "x " + shape_str(x.shape()) + " must be [..., D] with weight's D (weight " +
                        shape_str(weight.shape()) + ")");
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  if (targets.shape() != lead)
    check::fail(op, "targets " + shape_str(targets.shape()) + " must have x's leading shape " +
                        shape_str(lead) + " (x " + shape_str(x.shape()) + ")");
  if (chunk_rows < 0) check::fail(op, "chunk_rows " + std::to_string(chunk_rows) + " < 0");
  const int64_t n = targets.numel(), v = weight.size(0), d = weight.size(1);
  check_targets(op, targets, v, ignore_index);

  const Device dev = x.device();
  const DType acc = stats_dtype(x.dtype());  // losses, the divisor and the summed gradients
  Backend& be = backend_of(x);
  const Tensor x2 = x.view({n, d}), targets1 = targets.view({n});
  // The mean's divisor stays where the targets are, as in cross_entropy: no host round trip.
  Tensor inv_count = Tensor::empty({}, acc, dev);
  be.inverse_target_count(targets1, ignore_index, inv_count);

  const bool want_dx = any_requires_grad({x}), want_dw = any_requires_grad({weight});
  const bool grad = want_dx || want_dw;
  Tensor dx = want_dx ? Tensor::empty({n, d}, acc, dev) : Tensor();
  // dW starts as the first chunk's product; zeros only when there is no chunk.
  Tensor dw;
  if (want_dw) dw = n == 0 ? Tensor::zeros({v, d}, acc, dev) : Tensor::empty({v, d}, acc, dev);
  Tensor losses = Tensor::empty({n}, acc, dev);
  const int64_t rows = chunk_rows > 0 ? chunk_rows : linear_cross_entropy_chunk_rows(v, x.dtype());
  // One buffer for every chunk: the kernels of one chunk run before the next chunk's GEMM
  // overwrites it (one stream on a GPU).
  Tensor buffer = Tensor::empty({std::min(rows, n), v}, x.dtype(), dev);
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t r = std::min(rows, n - r0);
    Tensor logits = buffer.narrow0(0, r);  // [r,V]: logits, then dlogits
    const Tensor xc = x2.narrow0(r0, r);
    gemm_2d(xc, false, weight, true, false, logits);
    Tensor losses_c = losses.narrow0(r0, r);
    be.cross_entropy_with_dlogits(logits, targets1.narrow0(r0, r), ignore_index,
                                  grad ? inv_count : Tensor(), losses_c);
    if (want_dx) {
      Tensor dxc = dx.narrow0(r0, r);
      gemm_2d(logits, false, weight, false, false, dxc);  // [r,V] @ [V,D]
    }
    if (want_dw) gemm_2d(logits, true, xc, false, r0 > 0, dw);  // [r,V]^T @ [r,D]
  }
  Tensor loss = Tensor::empty({}, acc, dev);
  be.sum_all(losses, loss);
  be.binary(BinaryKind::Mul, Broadcast::Same, 1, 1, loss, inv_count, loss);

  if (grad) {
    record(loss, Op::LinearCrossEntropy, {x, weight},
           [dx, dw, x_shape = x.shape(), dtype = x.dtype()](const Tensor& g,
                                                            const NeedsGrad& needs) {
             // g is the loss's gradient, a 0-d tensor in acc (the loss's dtype), on the device.
             Tensor gx, gw;
             if (needs[0] && dx.defined()) gx = scaled_to(dx, g, dtype).view(x_shape);
             if (needs[1] && dw.defined()) gw = scaled_to(dw, g, dtype);
             return std::vector<Tensor>{gx, gw};
           });
  }
  return loss;
}

}  // namespace mod
