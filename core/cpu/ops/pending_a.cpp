// TEMPORARY during parallel development: deleted when group a lands.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stdexcept>
#include "core/cpu/cpu_backend.h"
namespace mod::cpu {
void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                       Tensor& rstd) { throw std::logic_error("rmsnorm_forward pending"); }
void CpuBackend::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        Tensor& dx, Tensor& dweight) { throw std::logic_error("rmsnorm_backward pending"); }
void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) { throw std::logic_error("layernorm_forward pending"); }
void CpuBackend::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) { throw std::logic_error("layernorm_backward pending"); }
void CpuBackend::gelu_forward(const Tensor& x, Tensor& y) { throw std::logic_error("gelu_forward pending"); }
void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) { throw std::logic_error("gelu_backward pending"); }
void CpuBackend::silu_forward(const Tensor& x, Tensor& y) { throw std::logic_error("silu_forward pending"); }
void CpuBackend::silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) { throw std::logic_error("silu_backward pending"); }
void CpuBackend::swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) { throw std::logic_error("swiglu_forward pending"); }
void CpuBackend::swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                       Tensor& dup) { throw std::logic_error("swiglu_backward pending"); }
void CpuBackend::softmax_forward(const Tensor& x, Tensor& y) { throw std::logic_error("softmax_forward pending"); }
void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) { throw std::logic_error("softmax_backward pending"); }
void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             Tensor& losses, Tensor& lse) { throw std::logic_error("cross_entropy_forward pending"); }
void CpuBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, double grad_scale, Tensor& dlogits) { throw std::logic_error("cross_entropy_backward pending"); }
}
