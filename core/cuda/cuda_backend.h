// The CUDA backend: cuBLAS for GEMM (cuBLASLt where an epilogue fuses an activation), cuDNN for bf16 attention, modtrain kernels for the rest.
// Methods are defined family by family in core/cuda/ops/<family>.cu beside the CPU's
// core/cpu/ops/<family>.cpp; memory, copies and conversions in cuda_backend.cu. Every kernel
// takes f32, f64 and bf16 (accumulating bf16 in f32), runs on compute_stream() and never
// synchronises the host, except copies to host memory.
#pragma once

#include "core/backend.h"

namespace mod::cuda {

class CudaBackend final : public Backend {
 public:
  Device device() const override { return Device::CUDA; }
  std::string describe() const override;
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  MemoryStats memory_stats() const override;
  void reset_peak_memory() override;
  void copy(const Tensor& src, Tensor& dst) override;
  void convert(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& dst, double value) override;
  void copy_rows(const Tensor& src, size_t src_offset, size_t src_pitch, Tensor& dst,
                 size_t dst_offset, size_t dst_pitch, size_t rows, size_t width) override;
  void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) override;
  void gemm_gelu(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& pre,
                 Tensor& out) override;
  void gemm_dgelu(const GemmArgs& args, const Tensor& a, const Tensor& b, const Tensor& pre,
                  Tensor& out) override;
  void row_scores_forward(const Tensor& x, const Tensor& w, Tensor& r) override;
  void row_scores_backward(const Tensor& x, const Tensor& w, const Tensor& dr, Tensor& dx,
                           bool accumulate_dx, Tensor& dw, bool accumulate_dw) override;
  void binary(BinaryKind kind, Broadcast bcast, int64_t outer, int64_t inner, const Tensor& a,
              const Tensor& b, Tensor& out) override;
  void scale(const Tensor& x, double alpha, Tensor& out) override;
  void axpy(double alpha, const Tensor& x, Tensor& y) override;
  void sum_all(const Tensor& x, Tensor& out) override;
  void sum_squares(const Tensor& x, Tensor& out) override;
  void sum_outer(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) override;
  void sum_inner(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) override;
  void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) override;
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override;
  void index_slice(const Tensor& ids, int64_t start, int64_t rows, Tensor& local,
                   Tensor& here) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                       Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        Tensor& dx, Tensor& dweight) override;
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) override;
  void add_rmsnorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight, double eps,
                           Tensor& s, Tensor& y, Tensor& rstd) override;
  void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                            const Tensor& weight, const Tensor& rstd, Tensor& dx,
                            Tensor& dweight) override;
  void add_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                             const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                             Tensor& rstd) override;
  void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              Tensor& dx, Tensor& dweight, Tensor& dbias) override;
  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void silu_forward(const Tensor& x, Tensor& y) override;
  void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void sigmoid_forward(const Tensor& x, Tensor& y) override;
  void sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;
  void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) override;
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                       Tensor& dup) override;
  void softmax_forward(const Tensor& x, Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void logsumexp_forward(const Tensor& x, Tensor& out) override;
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             Tensor& losses, Tensor& lse) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, int64_t vocab_start, const Tensor& scale,
                              Tensor& dlogits) override;
  void cross_entropy_with_dlogits(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                  const Tensor& scale, Tensor& losses) override;
  void rope(const Tensor& x, const Tensor& pos, double theta, bool inverse, Tensor& y) override;
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                         const Tensor& k_pos, Tensor& out, Tensor& lse) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                          const Tensor& k_pos, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) override;
  void gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) override;
  void scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) override;
  void scatter_gated_rows(const Tensor& idx, const Tensor& src, const Tensor& gate,
                          Tensor& out) override;
  void scatter_gated_rows_backward(const Tensor& dout, const Tensor& idx, const Tensor& src,
                                   const Tensor& gate, Tensor& dsrc, Tensor& dgate) override;
  void topk_rows(const Tensor& scores, int64_t k, Tensor& idx) override;
  void routing_summary(const Tensor& r, const Tensor& decision, const Tensor& member,
                       Tensor& out) override;
  void decode_admit(const Tensor& decision, const Tensor& active, Tensor& admit) override;
  void kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit, const Tensor& rows,
                       Tensor& len, Tensor& k_cache, Tensor& v_cache) override;
  void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& len, const Tensor& rows, Tensor& out) override;
  void masked_add(const Tensor& x, const Tensor& u, const Tensor& admit, Tensor& out) override;
  void sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args,
                     Tensor& next) override;
  void decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop,
                      int64_t eot, Tensor& tokens, Tensor& pos, Tensor& cur,
                      Tensor& active) override;
  void moe_select(const Tensor& probs, const MoeSelectArgs& args, Tensor& rows, Tensor& gate_rows,
                  Tensor& valid, Tensor& share, Tensor& counts) override;
  void bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                               Tensor& losses) override;
  void bce_with_logits_backward(const Tensor& logits, const Tensor& targets, double grad_scale,
                                Tensor& dlogits) override;
  void inverse_target_count(const Tensor& targets, int64_t ignore_index, Tensor& out) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                    const AdamWArgs& args, const Tensor& consts, const Tensor& grad_scale) override;
  void adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                          const Tensor& grad_scale, const std::vector<MultiTensorEntry>& entries,
                          Tensor& table, bool rewrite) override;
  void clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) override;
  void sum_squares_multi(const std::vector<Tensor>& xs,
                         const std::vector<MultiTensorEntry>& entries, Tensor& table,
                         bool rewrite, Tensor& out) override;
  void begin_capture() override;
  std::unique_ptr<CapturedWork> end_capture() override;
  void run_if_any(const Tensor& flags, const std::function<void()>& body) override;
};

// The process's CUDA backend (backend(Device::CUDA) in a CUDA build).
CudaBackend& cuda_backend();

}  // namespace mod::cuda
