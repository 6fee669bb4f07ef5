// bce_with_logits: mean over elements of the stable sigmoid cross-entropy (the MoD causal-routing
// loss). Only logits are recorded as an input: targets never receive a gradient.
#include "core/ops/loss.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

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

}  // namespace mod
