// rope: rotary position embedding by explicit positions. The rotation is orthogonal, so the
// backward is the same kernel rotating by the negative angle; positions carry no gradient.
#include "core/ops/rope.h"

#include <cmath>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops/check.h"

namespace mod {

namespace {
constexpr const char* kOp = "rope";

// Every position >= 0 (CPU tensors; device kernels trust the caller).
void check_nonnegative(const Tensor& pos) {
  if (pos.device() != Device::CPU) return;
  const int64_t cols = pos.size(1);
  auto scan = [&](const auto* p) {
    for (int64_t i = 0; i < pos.numel(); ++i)
      if (p[i] < 0)
        check::fail(kOp, "pos[" + std::to_string(i / cols) + ", " + std::to_string(i % cols) +
                             "] = " + std::to_string(p[i]) + " is negative");
  };
  if (pos.dtype() == DType::I32)
    scan(pos.data<int32_t>());
  else
    scan(pos.data<int64_t>());
}
}  // namespace

Tensor rope(const Tensor& x, const Tensor& pos, double theta) {
  check::floating(kOp, x, "x");
  check::dim(kOp, x, 4, "x [B,T,H,Dh]");
  if (x.size(3) % 2 != 0)
    check::fail(kOp, "head dim Dh = " + std::to_string(x.size(3)) + " of x " +
                         shape_str(x.shape()) + " must be even");
  check::index(kOp, pos, "pos");
  if (pos.shape() != Shape{x.size(0), x.size(1)})
    check::fail(kOp, "pos " + shape_str(pos.shape()) + " must be [B,T] = " +
                         shape_str({x.size(0), x.size(1)}) + " for x " + shape_str(x.shape()));
  check::same_device(kOp, pos, "pos", x, "x");
  if (!(theta > 0.0) || !std::isfinite(theta))
    check::fail(kOp, "theta = " + std::to_string(theta) + " must be positive and finite");
  check_nonnegative(pos);

  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_of(x).rope(x, pos, theta, /*inverse=*/false, y);
  if (any_requires_grad({x})) {
    record(y, Op::Rope, {x}, [pos, theta](const Tensor& g, const NeedsGrad&) {
      Tensor dx = Tensor::empty(g.shape(), g.dtype(), g.device());
      backend_of(g).rope(g, pos, theta, /*inverse=*/true, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace mod
