// The error state of the NCCL communicator (internal to parallel/nccl_*.cpp): NcclState, one NCCL
// communicator with its stream; NcclState::check, which waits out ncclInProgress and turns an
// NCCL error into an exception naming the call and the collective; and end_job. Invariant: a
// collective that hangs or fails asynchronously ends the job (end_job), never hangs silently.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "parallel/communicator.h"

namespace mod::parallel::nccl {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds);
std::string seconds_str(double seconds);  // "%g"

// Polls `done()` until it returns true (then true) or `deadline` passes (then false). Yields
// the core first, where fast operations finish, then sleeps with a doubling backoff capped at
// 1 ms, as MpiCommunicator::wait does.
template <typename Done>
bool poll_until(Done&& done, Clock::time_point deadline) {
  constexpr int kYieldPolls = 200;
  constexpr int kMaxSleepUs = 1000;
  int sleep_us = 1;
  for (int polls = 0;; ++polls) {
    if (done()) return true;
    if (Clock::now() > deadline) return false;
    if (polls < kYieldPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      sleep_us = std::min(2 * sleep_us, kMaxSleepUs);
    }
  }
}

// cudaEventQuery / cudaStreamQuery without leaving cudaErrorNotReady behind as this thread's
// last error, where the next MOD_CUDA_CHECK_LAUNCH would report it.
cudaError_t query(cudaEvent_t event);
cudaError_t query(cudaStream_t stream);

// "unhandled system error (<ncclGetLastError's detail>)".
std::string nccl_error(ncclResult_t rc, ncclComm_t comm);

// One NCCL communicator with its stream, shared by the NcclCommunicator that owns it and the
// watchdog's records of its collectives in flight. Teardown (ncclCommFinalize + Destroy, or
// ncclCommAbort) is in the destructor, so a half-built one is cleaned up too.
struct NcclState {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;   // recorded on the compute stream before each collective
  Communicator* host = nullptr;  // for abort(): owned by the NcclCommunicator, which outlives
                                 // every watchdog record of this state (it calls forget())
  std::string name;
  int rank = 0, size = 1;
  int world_rank = 0;      // the "modtrain: rank R:" prefix
  double timeout_s = 600;  // collective_timeout(), read once at construction
  bool clean = false;      // built completely and not torn down by an exception: finalize

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState();

  // "all_reduce on 'dp' (rank 1 of 2)", as detail::collective_where writes it.
  std::string where(const char* what) const {
    return std::string(what) + " on '" + name + "' (rank " + std::to_string(rank) + " of " +
           std::to_string(size) + ")";
  }
  // Waits out ncclInProgress (polling ncclCommGetAsyncError under the timeout; past it the job
  // ends), then throws std::runtime_error naming `call` and the collective unless rc is
  // ncclSuccess.
  void check(ncclResult_t rc, const char* call, const char* what);
};

// Checks one NCCL call made for collective `what` on NcclState `s` (see NcclState::check).
#define MOD_NCCL_CHECK(s, what, call) (s).check((call), #call, (what))

// Ends the job for a hung or failed NCCL collective: prints the message (first, in case
// ncclCommAbort blocks), aborts the NCCL communicator so its kernels stop, then ends every rank
// through the host communicator. The first caller does it; a second (the watchdog and the main
// thread at once) waits for the process to end.
[[noreturn]] void end_job(NcclState& s, const std::string& message);

}  // namespace mod::parallel::nccl
