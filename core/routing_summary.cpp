// RoutingSummary's argument check, shared by every backend's routing_summary (see backend.h).
#include <stdexcept>
#include <string>

#include "core/backend.h"

namespace mod {

void RoutingSummary::check(const Tensor& r, const Tensor& decision, const Tensor& member,
                           const Tensor& out) {
  auto fail = [](const std::string& what) {
    throw std::invalid_argument("routing_summary: " + what);
  };
  if (r.dim() < 1 || r.numel() == 0) fail("r " + shape_str(r.shape()) + " is empty");
  for (const Tensor* x : {&decision, &member})
    if (x->shape() != r.shape() || x->dtype() != r.dtype() || x->device() != r.device())
      fail("decision and member must match r " + shape_str(r.shape()) + " " +
           dtype_name(r.dtype()) + ", got " + shape_str(x->shape()) + " " +
           dtype_name(x->dtype()));
  if (out.dtype() != DType::F64 || out.numel() != kSize || out.device() != r.device())
    fail("out must be f64 [" + std::to_string(kSize) + "] on r's device, got " +
         shape_str(out.shape()) + " " + dtype_name(out.dtype()));
}

}  // namespace mod
