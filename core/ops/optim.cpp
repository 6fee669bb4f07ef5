// adamw_update: validates, then one in-place backend pass. Outside autograd by design: it
// rewrites parameter storage and records nothing.
#include "core/ops/optim.h"

#include "core/ops/check.h"

namespace mod {

namespace {
constexpr const char* kOp = "adamw";

void like_param(const Tensor& param, const Tensor& t, const char* name) {
  check::floating(kOp, t, name);
  check::same_dtype_device(kOp, param, "param", t, name);
  check::same_shape(kOp, param, "param", t, name);
}
}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args) {
  check::floating(kOp, param, "param");
  like_param(param, grad, "grad");
  like_param(param, m, "m");
  like_param(param, v, "v");
  if (args.step < 1)
    check::fail(kOp, "step = " + std::to_string(args.step) + " must be >= 1 (it is 1-based)");
  if (!(args.beta1 >= 0.0 && args.beta1 < 1.0) || !(args.beta2 >= 0.0 && args.beta2 < 1.0))
    check::fail(kOp, "beta1 = " + std::to_string(args.beta1) +
                         " and beta2 = " + std::to_string(args.beta2) + " must lie in [0, 1)");
  if (!(args.lr >= 0.0) || !(args.eps >= 0.0) || !(args.weight_decay >= 0.0))
    check::fail(kOp, "lr = " + std::to_string(args.lr) + ", eps = " + std::to_string(args.eps) +
                         ", weight_decay = " + std::to_string(args.weight_decay) + " must be >= 0");
  backend_of(param).adamw_update(param, grad, m, v, args);
}

}  // namespace mod
