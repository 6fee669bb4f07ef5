// The event and Work types of the NCCL communicator (internal to parallel/nccl_*.cpp).
// Invariant: a pending NcclWork keeps its tensor alive and, once waited or destroyed, orders
// the compute stream after its collective, so no later kernel sees the buffer mid-write.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <utility>

#include "core/cuda/cuda_check.h"
#include "core/cuda/stream.h"
#include "parallel/communicator.h"
#include "parallel/nccl_state.h"

namespace mod::parallel::nccl {

// A CUDA event without timing (the cheap kind). Destroying one still pending is allowed: CUDA
// releases it once it completes.
class Event {
 public:
  Event() { MOD_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// A collective already complete (a group of one).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

// The async collectives over NCCL (all_reduce, reduce_scatter, all_gather): wait() orders the
// compute stream after the collective; its tensors are held until then (or until test() has
// seen it finish). A collective captured into a CUDA graph has not run yet, and its event may
// not be queried: test() says false.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Event> done, bool captured, Tensor t, Tensor t2 = {})
      : done_(std::move(done)), t_(std::move(t)), t2_(std::move(t2)), captured_(captured) {}
  ~NcclWork() override {
    if (done_) cudaStreamWaitEvent(cuda::compute_stream(), done_->get(), 0);  // as wait(), no throw
  }
  void wait() override {
    if (!done_) return;
    MOD_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(), done_->get(), 0));
    release();
  }
  bool test() override {
    if (!done_) return true;
    if (captured_) return false;
    const cudaError_t rc = query(done_->get());
    if (rc == cudaErrorNotReady) return false;
    MOD_CUDA_CHECK(rc);
    release();  // finished on the GPU: every later kernel already comes after it
    return true;
  }

 private:
  void release() {
    done_.reset();
    t_ = Tensor();
    t2_ = Tensor();
  }
  std::shared_ptr<Event> done_;  // null once waited
  Tensor t_, t2_;                // keep the buffers alive while NCCL reads and writes them
  bool captured_;                // enqueued while the compute stream captured
};

}  // namespace mod::parallel::nccl
