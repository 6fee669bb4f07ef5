// TEMPORARY during parallel development: deleted when group c lands.
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <stdexcept>
#include "core/cpu/cpu_backend.h"
namespace mod::cpu {
void CpuBackend::embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) { throw std::logic_error("embedding_forward pending"); }
void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) { throw std::logic_error("embedding_backward pending"); }
void CpuBackend::gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) { throw std::logic_error("gather_rows pending"); }
void CpuBackend::scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) { throw std::logic_error("scatter_add_rows pending"); }
void CpuBackend::topk_rows(const Tensor& scores, int64_t k, Tensor& idx) { throw std::logic_error("topk_rows pending"); }
void CpuBackend::bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                               Tensor& losses) { throw std::logic_error("bce_with_logits_forward pending"); }
void CpuBackend::bce_with_logits_backward(const Tensor& logits, const Tensor& targets, double grad_scale,
                                Tensor& dlogits) { throw std::logic_error("bce_with_logits_backward pending"); }
void CpuBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWArgs& args) { throw std::logic_error("adamw_update pending"); }
}
