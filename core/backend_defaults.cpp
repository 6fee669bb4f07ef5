// What a backend runs for a composite kernel it has no fused version of: the ops it stands
// for, in their order, so such a backend's fused op equals the unfused ops bit for bit.
#include "core/backend.h"

namespace mod {

void Backend::gemm_gelu(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& pre,
                        Tensor& out) {
  gemm(args, a, b, pre);
  gelu_forward(pre, out);
}

void Backend::gemm_dgelu(const GemmArgs& args, const Tensor& a, const Tensor& b,
                         const Tensor& pre, Tensor& out) {
  gemm(args, a, b, out);
  gelu_backward(pre, out, out);  // elementwise, so dx may be dy
}

}  // namespace mod
