// Gradient clipping (see grad_clip.h).
#include "train/grad_clip.h"

#include <stdexcept>

#include "core/backend.h"

namespace mod::train {

Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  Tensor total = Tensor::zeros({}, DType::F64, device);
  if (grads.empty()) return total;
  // One slot per gradient, its squares summed in one pass (accumulating in double), then the
  // slots added up in f64 (as the norm's square of a large model must be).
  const DType dtype = grads.front().dtype();
  Tensor sums = Tensor::zeros({static_cast<int64_t>(grads.size())}, dtype, device);
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (g.dtype() != dtype || g.device() != device)
      throw std::logic_error("grad_sq_sum: gradient " + describe(g) + " differs from " +
                             describe(grads.front()) + " in dtype or device");
    Tensor slot = sums.narrow0(static_cast<int64_t>(i), 1);
    backend_of(g).sum_squares(g, slot);
  }
  backend(device).sum_all(sums.to(DType::F64), total);
  return total;
}

ClipFactor clip_factor_for(const std::vector<Tensor>& params, const Tensor& sq, double max_norm) {
  DType dtype = DType::F64;  // the gradients' (none: the factor scales nothing)
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      dtype = p.grad().dtype();
      break;
    }
  ClipFactor c{Tensor::empty({}, DType::F64, sq.device()), Tensor::empty({}, dtype, sq.device())};
  backend_of(sq).clip_factor(sq, max_norm, c.norm, c.factor);
  return c;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const Device device = params.empty() ? Device::CPU : params.front().device();
  const ClipFactor c = clip_factor_for(params, grad_sq_sum(params, device), max_norm);
  // On the host a factor of 1 is seen for free and the pass skipped; a device always scales.
  if (c.factor.device() == Device::CPU && c.factor.item() == 1.0) return c.norm.item();
  Backend& be = backend(device);
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) be.binary(BinaryKind::Mul, Broadcast::Outer, 1, g.numel(), g, c.factor, g);
  }
  return c.norm.item();
}

}  // namespace mod::train
