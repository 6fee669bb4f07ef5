// TEMPORARY during parallel development: deleted when group b lands.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stdexcept>
#include "core/cpu/cpu_backend.h"
namespace mod::cpu {
void CpuBackend::rope(const Tensor& x, const Tensor& pos, double theta, bool inverse, Tensor& y) { throw std::logic_error("rope pending"); }
void CpuBackend::attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                         const Tensor& k_pos, Tensor& out, Tensor& lse) { throw std::logic_error("attention_forward pending"); }
void CpuBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                          const Tensor& k_pos, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) { throw std::logic_error("attention_backward pending"); }
}
