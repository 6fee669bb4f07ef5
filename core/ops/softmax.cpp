// Softmax and logsumexp over the last dim, and the fused cross-entropy: inputs [..., V] are
// viewed as rows [N,V]. Logsumexp's backward recomputes softmax from its saved input.
// Cross-entropy's forward caches per-row lse [N] and never materialises probabilities; the
// backward recomputes them from lse. The loss is the mean over targets != ignore_index (0 if
// none).
#include "core/ops/softmax.h"

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {

int64_t leading_numel(const Tensor& x) {
  return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
}

}  // namespace

void check_targets(const char* op, const Tensor& targets, int64_t v, int64_t ignore_index) {
  if (targets.device() != Device::CPU) return;  // no host round trip: shards are checked
  const int64_t n = targets.numel();
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = static_cast<int64_t>(p[i]);
      if (t != ignore_index && (t < 0 || t >= v))
        check::fail(op, "targets[" + std::to_string(i) + "] = " + std::to_string(t) +
                            " is out of range [0, " + std::to_string(v) +
                            ") and is not ignore_index (" + std::to_string(ignore_index) + ")");
    }
  };
  if (targets.dtype() == DType::I32)
    scan(targets.data<int32_t>());
  else
    scan(targets.data<int64_t>());
}

Tensor softmax(const Tensor& x) {
  const char* op = op_name(Op::Softmax);
  check::floating(op, x, "x");
  if (x.dim() < 1) check::fail(op, "x " + shape_str(x.shape()) + " needs at least one dim");
  const Shape rows{leading_numel(x), x.size(-1)};
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor y2 = y.view(rows);
  backend_of(x).softmax_forward(x.view(rows), y2);
  if (any_requires_grad({x})) {
    record(y, Op::Softmax, {x}, [ys = detach(y2)](const Tensor& g, const NeedsGrad&) {
      Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
      Tensor dx2 = dx.view(ys.shape());
      backend_of(g).softmax_backward(ys, g.view(ys.shape()), dx2);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor logsumexp(const Tensor& x) {
  const char* op = op_name(Op::LogSumExp);
  check::floating(op, x, "x");
  if (x.dim() < 1 || x.size(-1) == 0)
    check::fail(op, "x " + shape_str(x.shape()) + " needs a non-empty last dim V");
  const int64_t v = x.size(-1), n = x.numel() / v;
  const Tensor x2 = x.view({n, v});
  const Shape lead(x.shape().begin(), x.shape().end() - 1);
  Tensor out = Tensor::empty(lead, x.dtype(), x.device());
  Tensor out1 = out.view({n});
  backend_of(x).logsumexp_forward(x2, out1);
  if (any_requires_grad({x})) {
    // Saves x (alive anyway as the caller's activation) rather than softmax(x), which would be
    // a second [N,V] buffer held until backward; recomputing it costs one exp per element.
    record(out, Op::LogSumExp, {x}, [x2, shape = x.shape()](const Tensor& g, const NeedsGrad&) {
      Tensor dx = Tensor::empty(shape, g.dtype(), g.device());
      Tensor dx2 = dx.view(x2.shape());
      Backend& b = backend_of(g);
      b.softmax_forward(x2, dx2);
      b.binary(BinaryKind::Mul, Broadcast::Outer, x2.size(0), x2.size(1), dx2, g, dx2);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  const char* op = op_name(Op::CrossEntropy);
  check::floating(op, logits, "logits");
  check::index(op, targets, "targets");
  if (logits.dim() < 1 || logits.size(-1) == 0)
    check::fail(op, "logits " + shape_str(logits.shape()) + " needs a non-empty last dim V");
  const Shape lead(logits.shape().begin(), logits.shape().end() - 1);
  if (targets.shape() != lead)
    check::fail(op, "targets " + shape_str(targets.shape()) + " must have logits' leading shape " +
                        shape_str(lead) + " (logits " + shape_str(logits.shape()) + ")");
  check::same_device(op, targets, "targets", logits, "logits");
  const int64_t v = logits.size(-1), n = targets.numel();
  check_targets(op, targets, v, ignore_index);

  const Tensor logits2 = logits.view({n, v}), targets1 = targets.view({n});
  Tensor losses = Tensor::empty({n}, logits.dtype(), logits.device());
  Tensor lse = Tensor::empty({n}, stats_dtype(logits.dtype()), logits.device());
  Backend& be = backend_of(logits);
  be.cross_entropy_forward(logits2, targets1, ignore_index, losses, lse);
  Tensor loss = Tensor::empty({}, logits.dtype(), logits.device());
  be.sum_all(losses, loss);
  // The mean's divisor stays where the targets are: a captured step (CUDA graph) recounts it.
  Tensor inv_count = Tensor::empty({}, logits.dtype(), logits.device());
  be.inverse_target_count(targets1, ignore_index, inv_count);
  be.binary(BinaryKind::Mul, Broadcast::Same, 1, 1, loss, inv_count, loss);

  if (any_requires_grad({logits}))
    record_cross_entropy_grad(loss, Op::CrossEntropy, logits, targets1, lse, ignore_index, 0,
                              inv_count);
  return loss;
}

void record_cross_entropy_grad(Tensor& loss, Op op, const Tensor& logits,
                               const Tensor& targets, const Tensor& lse, int64_t ignore_index,
                               int64_t vocab_start, const Tensor& inv_count) {
  const int64_t v = logits.size(-1);
  const Tensor logits2 = logits.view({logits.numel() / v, v});
  record(loss, op, {logits},
         [logits2, targets1 = targets.view({targets.numel()}).clone(), lse, ignore_index,
          vocab_start, inv_count, shape = logits.shape()](const Tensor& g, const NeedsGrad&) {
           Tensor dlogits = Tensor::empty(shape, g.dtype(), g.device());
           Tensor d2 = dlogits.view(logits2.shape());
           Backend& b = backend_of(g);
           // s = g / count stays on the device: the kernel reads it, so no pass rescales dlogits.
           Tensor s = Tensor::empty({}, g.dtype(), g.device());
           b.binary(BinaryKind::Mul, Broadcast::Same, 1, 1, g, inv_count, s);
           b.cross_entropy_backward(logits2, targets1, lse, ignore_index, vocab_start, s, d2);
           return std::vector<Tensor>{dlogits};
         });
}

}  // namespace mod
