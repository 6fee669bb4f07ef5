// The NCCL watchdog's thread (see nccl_watchdog.h).
#include "parallel/nccl_watchdog.h"

#include <chrono>
#include <thread>
#include <utility>

#include "core/cuda/stream.h"

namespace mod::parallel::nccl {

Watchdog& Watchdog::get() {
  static Watchdog* watchdog = new Watchdog(cuda::current_device());
  return *watchdog;
}

Watchdog::Watchdog(int device) : device_(device) {
  std::thread([this] { run(); }).detach();
}

void Watchdog::watch(InFlight entry) {
  bool was_idle = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    was_idle = entries_.empty();
    entries_.push_back(std::move(entry));
  }
  if (was_idle) wake_.notify_one();
}

void Watchdog::forget(const NcclState* state) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(entries_, [&](const InFlight& e) { return e.state.get() == state; });
}

void Watchdog::run() {
  constexpr auto kPoll = std::chrono::milliseconds(50);
  cudaSetDevice(device_);  // the device the events belong to (already set up on the main thread)
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (entries_.empty())
      wake_.wait(lock, [&] { return !entries_.empty(); });
    else
      wake_.wait_for(lock, kPoll);
    const Clock::time_point now = Clock::now();
    for (size_t i = 0; i < entries_.size();) {
      InFlight& e = entries_[i];
      const cudaError_t rc = query(e.done->get());
      if (rc == cudaSuccess) {
        if (i + 1 < entries_.size()) e = std::move(entries_.back());
        entries_.pop_back();
        continue;
      }
      if (rc == cudaErrorCudartUnloading) return;  // the process is exiting
      NcclState& s = *e.state;
      if (rc != cudaErrorNotReady)
        end_job(s, "NCCL " + s.where(e.what) + " failed: CUDA: " + cudaGetErrorString(rc));
      ncclResult_t async = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(s.comm, &async);
      const ncclResult_t error = queried != ncclSuccess ? queried : async;
      if (error != ncclSuccess && error != ncclInProgress)
        end_job(s, "NCCL " + s.where(e.what) + " failed: " + nccl_error(error, s.comm));
      if (now > e.deadline)
        end_job(s, "NCCL " + s.where(e.what) + " timed out after " + seconds_str(s.timeout_s) +
                       "s: a peer rank has probably exited or is stuck");
      ++i;
    }
  }
}

}  // namespace mod::parallel::nccl
