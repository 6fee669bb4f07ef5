// Gradient clipping (see grad_clip.h).
#include "train/grad_clip.h"

#include <stdexcept>

#include "core/backend.h"
#include "core/ops/optim.h"

namespace mod::train {

Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device, MultiTensorTable& table) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return sq_sum_of_grads(grads, device, table);
}

Tensor sq_sum_of_grads(const std::vector<Tensor>& grads, Device device, MultiTensorTable& table) {
  for (const Tensor& g : grads)
    if (g.dtype() != grads.front().dtype() || g.device() != device)
      throw std::logic_error("grad_sq_sum: gradient " + describe(g) + " differs from " +
                             describe(grads.front()) + " in dtype or device");
  // Every gradient's squares in one pass, accumulated in double (as the norm's square of a
  // large model must be): on a GPU one launch over the table and one over its partials.
  return sum_squares_multi(grads, device, table);
}

Tensor grad_sq_sum(const std::vector<Tensor>& params, Device device) {
  MultiTensorTable table;
  return grad_sq_sum(params, device, table);
}

ClipFactor clip_factor_for(const std::vector<Tensor>& params, const Tensor& sq, double max_norm) {
  DType dtype = DType::F64;  // the gradients' (none: the factor scales nothing)
  for (const Tensor& p : params)
    if (p.grad().defined()) {
      dtype = p.grad().dtype();
      break;
    }
  return clip_factor_for(dtype, sq, max_norm);
}

ClipFactor clip_factor_for(DType dtype, const Tensor& sq, double max_norm) {
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
