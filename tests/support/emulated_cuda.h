// The GPU code path without a GPU: a backend that reports Device::CUDA but runs the CPU kernels
// on host memory. Installed, it serves every "cuda" tensor in the program, so training with
// train.device CUDA exercises the device path's plumbing, and any host access to a device
// tensor that was missed (Tensor::at, set) throws. Its kernels being the CPU's, results must
// equal a CPU run's bitwise.
//
// It captures as a CUDA graph does: between begin_capture and end_capture every kernel call is
// recorded (with the tensors it was given) instead of run, a copy between host and device
// throws (on a GPU it would synchronise, failing the capture), and replay() runs the recorded
// calls again on the same memory. A step that only works because host code ran between its
// kernels (a value read back, a constant baked in) gives different numbers when replayed.
// run_if_any inside a capture records its body apart and, at each replay, runs it only when a
// flag is set, as a conditional graph node does; eagerly the body runs, as on a GPU.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_backend.h"

namespace mod::test {

class EmulatedCudaBackend final : public cpu::CpuBackend {
 public:
  Device device() const override { return Device::CUDA; }
  std::string describe() const override { return "emulated CUDA (CPU kernels)"; }

  void begin_capture() override {
    if (recording_) throw std::logic_error("capture: already capturing");
    recording_ = std::make_shared<Calls>();
  }
  std::unique_ptr<CapturedWork> end_capture() override {
    if (!recording_) throw std::logic_error("capture: end_capture without begin_capture");
    auto work = std::make_unique<Recorded>(std::move(recording_));
    recording_.reset();
    ++captures_;
    return work;
  }
  int captures() const { return captures_; }  // end_capture calls so far
  // Conditional bodies that replays ran and skipped so far.
  int64_t bodies_run() const { return bodies_run_; }
  int64_t bodies_skipped() const { return bodies_skipped_; }

  void run_if_any(const Tensor& flags, const std::function<void()>& body) override {
    if (!recording_) return body();
    auto outer = std::move(recording_);
    recording_ = std::make_shared<Calls>();
    try {
      body();
    } catch (...) {
      recording_ = std::move(outer);
      throw;
    }
    auto inner = std::move(recording_);
    recording_ = std::move(outer);
    recording_->emplace_back([flags, inner, this] {
      const int64_t* f = flags.data<int64_t>();
      bool any = false;
      for (int64_t i = 0; i < flags.numel(); ++i) any = any || f[i] != 0;
      if (!any) {
        ++bodies_skipped_;
        return;
      }
      ++bodies_run_;
      for (auto& call : *inner) call();
    });
  }
  // Host work in stream order, as a GPU runs an NCCL kernel: now, or at every replay when
  // called inside a capture (host_staging_communicator.h's collectives).
  void enqueue_host_task(std::function<void()> task) { run(std::move(task)); }

  void copy(const Tensor& src, Tensor& dst) override {
    if (recording_ && (src.device() == Device::CPU || dst.device() == Device::CPU))
      throw std::logic_error("capture: a copy between host and device (" + mod::describe(src) +
                             " -> " + mod::describe(dst) + ") inside a captured step");
    run([=, this]() mutable { CpuBackend::copy(src, dst); });
  }
  void convert(const Tensor& src, Tensor& dst) override {
    run([=, this]() mutable { CpuBackend::convert(src, dst); });
  }
  void fill(Tensor& dst, double value) override {
    run([=, this]() mutable { CpuBackend::fill(dst, value); });
  }
  void copy_rows(const Tensor& src, size_t src_offset, size_t src_pitch, Tensor& dst,
                 size_t dst_offset, size_t dst_pitch, size_t rows, size_t width) override {
    run([=, this]() mutable {
      CpuBackend::copy_rows(src, src_offset, src_pitch, dst, dst_offset, dst_pitch, rows, width);
    });
  }
  void gemm(const GemmArgs& args, const Tensor& a, const Tensor& b, Tensor& c) override {
    run([=, this]() mutable { CpuBackend::gemm(args, a, b, c); });
  }
  void binary(BinaryKind kind, Broadcast bcast, int64_t outer, int64_t inner, const Tensor& a,
              const Tensor& b, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::binary(kind, bcast, outer, inner, a, b, out); });
  }
  void scale(const Tensor& x, double alpha, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::scale(x, alpha, out); });
  }
  void axpy(double alpha, const Tensor& x, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::axpy(alpha, x, y); });
  }
  void sum_all(const Tensor& x, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::sum_all(x, out); });
  }
  void sum_squares(const Tensor& x, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::sum_squares(x, out); });
  }
  void sum_outer(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::sum_outer(outer, inner, x, out); });
  }
  void sum_inner(int64_t outer, int64_t inner, const Tensor& x, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::sum_inner(outer, inner, x, out); });
  }
  void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::embedding_forward(ids, table, out); });
  }
  void embedding_backward(const Tensor& ids, const Tensor& dout, Tensor& dtable) override {
    run([=, this]() mutable { CpuBackend::embedding_backward(ids, dout, dtable); });
  }
  void index_slice(const Tensor& ids, int64_t start, int64_t rows, Tensor& local,
                   Tensor& here) override {
    run([=, this]() mutable { CpuBackend::index_slice(ids, start, rows, local, here); });
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& weight, double eps, Tensor& y,
                       Tensor& rstd) override {
    run([=, this]() mutable { CpuBackend::rmsnorm_forward(x, weight, eps, y, rstd); });
  }
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                        Tensor& dx, Tensor& dweight) override {
    run([=, this]() mutable { CpuBackend::rmsnorm_backward(dy, x, weight, rstd, dx, dweight); });
  }
  void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                         Tensor& y, Tensor& mean, Tensor& rstd) override {
    run([=, this]() mutable {
      CpuBackend::layernorm_forward(x, weight, bias, eps, y, mean, rstd);
    });
  }
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dweight,
                          Tensor& dbias) override {
    run([=, this]() mutable {
      CpuBackend::layernorm_backward(dy, x, weight, mean, rstd, dx, dweight, dbias);
    });
  }
  void add_rmsnorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight, double eps,
                           Tensor& s, Tensor& y, Tensor& rstd) override {
    run([=, this]() mutable { CpuBackend::add_rmsnorm_forward(x, a, weight, eps, s, y, rstd); });
  }
  void add_rmsnorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                            const Tensor& weight, const Tensor& rstd, Tensor& dx,
                            Tensor& dweight) override {
    run([=, this]() mutable {
      CpuBackend::add_rmsnorm_backward(dy, ds, s, weight, rstd, dx, dweight);
    });
  }
  void add_layernorm_forward(const Tensor& x, const Tensor& a, const Tensor& weight,
                             const Tensor& bias, double eps, Tensor& s, Tensor& y, Tensor& mean,
                             Tensor& rstd) override {
    run([=, this]() mutable {
      CpuBackend::add_layernorm_forward(x, a, weight, bias, eps, s, y, mean, rstd);
    });
  }
  void add_layernorm_backward(const Tensor& dy, const Tensor& ds, const Tensor& s,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                              Tensor& dx, Tensor& dweight, Tensor& dbias) override {
    run([=, this]() mutable {
      CpuBackend::add_layernorm_backward(dy, ds, s, weight, mean, rstd, dx, dweight, dbias);
    });
  }
  void gelu_forward(const Tensor& x, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::gelu_forward(x, y); });
  }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    run([=, this]() mutable { CpuBackend::gelu_backward(x, dy, dx); });
  }
  void silu_forward(const Tensor& x, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::silu_forward(x, y); });
  }
  void silu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    run([=, this]() mutable { CpuBackend::silu_backward(x, dy, dx); });
  }
  void sigmoid_forward(const Tensor& x, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::sigmoid_forward(x, y); });
  }
  void sigmoid_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    run([=, this]() mutable { CpuBackend::sigmoid_backward(x, dy, dx); });
  }
  void swiglu_forward(const Tensor& gate, const Tensor& up, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::swiglu_forward(gate, up, y); });
  }
  void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                       Tensor& dup) override {
    run([=, this]() mutable { CpuBackend::swiglu_backward(gate, up, dy, dgate, dup); });
  }
  void softmax_forward(const Tensor& x, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::softmax_forward(x, y); });
  }
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override {
    run([=, this]() mutable { CpuBackend::softmax_backward(y, dy, dx); });
  }
  void logsumexp_forward(const Tensor& x, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::logsumexp_forward(x, out); });
  }
  void cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                             Tensor& losses, Tensor& lse) override {
    run([=, this]() mutable {
      CpuBackend::cross_entropy_forward(logits, targets, ignore_index, losses, lse);
    });
  }
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                              int64_t ignore_index, int64_t vocab_start, const Tensor& scale,
                              Tensor& dlogits) override {
    run([=, this]() mutable {
      CpuBackend::cross_entropy_backward(logits, targets, lse, ignore_index, vocab_start, scale,
                                         dlogits);
    });
  }
  void cross_entropy_with_dlogits(Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                  const Tensor& scale, Tensor& losses) override {
    run([=, this]() mutable {
      CpuBackend::cross_entropy_with_dlogits(logits, targets, ignore_index, scale, losses);
    });
  }
  void rope(const Tensor& x, const Tensor& pos, double theta, bool inverse, Tensor& y) override {
    run([=, this]() mutable { CpuBackend::rope(x, pos, theta, inverse, y); });
  }
  void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                         const Tensor& k_pos, Tensor& out, Tensor& lse) override {
    run([=, this]() mutable { CpuBackend::attention_forward(q, k, v, q_pos, k_pos, out, lse); });
  }
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                          const Tensor& k_pos, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) override {
    run([=, this]() mutable {
      CpuBackend::attention_backward(q, k, v, q_pos, k_pos, out, lse, dout, dq, dk, dv);
    });
  }
  void gather_rows(const Tensor& x, const Tensor& idx, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::gather_rows(x, idx, out); });
  }
  void scatter_add_rows(const Tensor& idx, const Tensor& src, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::scatter_add_rows(idx, src, out); });
  }
  void topk_rows(const Tensor& scores, int64_t k, Tensor& idx) override {
    run([=, this]() mutable { CpuBackend::topk_rows(scores, k, idx); });
  }
  void routing_summary(const Tensor& r, const Tensor& decision, const Tensor& member,
                       Tensor& out) override {
    run([=, this]() mutable { CpuBackend::routing_summary(r, decision, member, out); });
  }
  void decode_admit(const Tensor& decision, const Tensor& active, Tensor& admit) override {
    run([=, this]() mutable { CpuBackend::decode_admit(decision, active, admit); });
  }
  void kv_cache_append(const Tensor& k, const Tensor& v, const Tensor& admit, const Tensor& rows,
                       Tensor& len, Tensor& k_cache, Tensor& v_cache) override {
    run([=, this]() mutable {
      CpuBackend::kv_cache_append(k, v, admit, rows, len, k_cache, v_cache);
    });
  }
  void decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& len, const Tensor& rows, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::decode_attention(q, k_cache, v_cache, len, rows, out); });
  }
  void masked_add(const Tensor& x, const Tensor& u, const Tensor& admit, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::masked_add(x, u, admit, out); });
  }
  void sample_tokens(const Tensor& logits, const Tensor& pos, const SampleArgs& args,
                     Tensor& next) override {
    run([=, this]() mutable { CpuBackend::sample_tokens(logits, pos, args, next); });
  }
  void decode_advance(const Tensor& next, const Tensor& prompt_len, const Tensor& stop,
                      int64_t eot, Tensor& tokens, Tensor& pos, Tensor& cur,
                      Tensor& active) override {
    run([=, this]() mutable {
      CpuBackend::decode_advance(next, prompt_len, stop, eot, tokens, pos, cur, active);
    });
  }
  void moe_select(const Tensor& probs, const MoeSelectArgs& args, Tensor& rows, Tensor& gate_rows,
                  Tensor& valid, Tensor& share, Tensor& counts) override {
    run([=, this]() mutable {
      CpuBackend::moe_select(probs, args, rows, gate_rows, valid, share, counts);
    });
  }
  void bce_with_logits_forward(const Tensor& logits, const Tensor& targets,
                               Tensor& losses) override {
    run([=, this]() mutable { CpuBackend::bce_with_logits_forward(logits, targets, losses); });
  }
  void bce_with_logits_backward(const Tensor& logits, const Tensor& targets, double grad_scale,
                                Tensor& dlogits) override {
    run([=, this]() mutable {
      CpuBackend::bce_with_logits_backward(logits, targets, grad_scale, dlogits);
    });
  }
  void inverse_target_count(const Tensor& targets, int64_t ignore_index, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::inverse_target_count(targets, ignore_index, out); });
  }
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWArgs& args,
                    const Tensor& consts, const Tensor& grad_scale) override {
    run([=, this]() mutable {
      CpuBackend::adamw_update(param, grad, m, v, args, consts, grad_scale);
    });
  }
  void adamw_update_multi(const std::vector<AdamWSlot>& slots, const AdamWArgs& args,
                          const Tensor& grad_scale, const std::vector<MultiTensorEntry>& entries,
                          Tensor& table, bool rewrite) override {
    run([=, this]() mutable {
      CpuBackend::adamw_update_multi(slots, args, grad_scale, entries, table, rewrite);
    });
  }
  void clip_factor(const Tensor& sq, double max_norm, Tensor& norm, Tensor& factor) override {
    run([=, this]() mutable { CpuBackend::clip_factor(sq, max_norm, norm, factor); });
  }
  void sum_squares_multi(const std::vector<Tensor>& xs,
                         const std::vector<MultiTensorEntry>& entries, Tensor& table,
                         bool rewrite, Tensor& out) override {
    run([=, this]() mutable { CpuBackend::sum_squares_multi(xs, entries, table, rewrite, out); });
  }

 private:
  using Calls = std::vector<std::function<void()>>;
  struct Recorded final : CapturedWork {
    explicit Recorded(std::shared_ptr<Calls> c) : calls(std::move(c)) {}
    void replay() override {
      for (auto& call : *calls) call();
    }
    std::shared_ptr<Calls> calls;
  };
  template <typename F>
  void run(F&& f) {
    if (recording_)
      recording_->emplace_back(std::forward<F>(f));
    else
      f();
  }

  std::shared_ptr<Calls> recording_;  // non-null while capturing
  int captures_ = 0;
  int64_t bodies_run_ = 0, bodies_skipped_ = 0;
};

// Installed for the whole program: device tensors may outlive any one test case.
inline EmulatedCudaBackend& emulate_cuda() {
  static EmulatedCudaBackend* backend = [] {
    auto* b = new EmulatedCudaBackend;
    set_cuda_backend_for_testing(b);
    return b;
  }();
  return *backend;
}

}  // namespace mod::test
