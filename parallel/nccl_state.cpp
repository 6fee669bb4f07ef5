// NcclState's check and teardown, and end_job (see nccl_state.h). Communicators are
// non-blocking (config.blocking = 0): any NCCL call may return ncclInProgress and is done (a
// collective: enqueued) only once ncclCommGetAsyncError leaves ncclInProgress; check waits that
// out under the collective timeout. A non-blocking communicator is also one that ncclCommAbort
// can stop from the watchdog while the main thread is inside a call.
#include "parallel/nccl_state.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace mod::parallel::nccl {

namespace {

cudaError_t forget_not_ready(cudaError_t rc) {
  if (rc == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
  return rc;
}

// "ncclAllReduce" from the text of a whole call.
std::string call_name(const char* call) {
  return std::string(call, std::strcspn(call, "( "));
}

// Polls ncclCommGetAsyncError until `rc` (an ncclInProgress to wait out) settles or `deadline`
// passes; false then.
bool settle(ncclComm_t comm, ncclResult_t& rc, Clock::time_point deadline) {
  return poll_until(
      [&] {
        ncclResult_t state = ncclInProgress;
        const ncclResult_t queried = ncclCommGetAsyncError(comm, &state);
        rc = queried != ncclSuccess ? queried : state;
        return rc != ncclInProgress;
      },
      deadline);
}

// ncclCommAbort, given at most 10 s: it can itself hang in some NCCL versions (NVIDIA/nccl#829),
// and a job that ends without it is better than one that never ends. On timeout the helper
// thread is left behind (the caller is ending the process or leaking the communicator).
void abort_bounded(ncclComm_t comm) {
  if (comm == nullptr) return;
  constexpr double kGraceSeconds = 10;
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread([comm, finished] {
    ncclCommAbort(comm);
    finished->store(true);
  }).detach();
  poll_until([&] { return finished->load(); }, deadline_after(kGraceSeconds));
}

std::atomic<bool> g_ending{false};

}  // namespace

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string seconds_str(double seconds) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", seconds);
  return text;
}

cudaError_t query(cudaEvent_t event) {
  return forget_not_ready(cudaEventQuery(event));
}
cudaError_t query(cudaStream_t stream) {
  return forget_not_ready(cudaStreamQuery(stream));
}

std::string nccl_error(ncclResult_t rc, ncclComm_t comm) {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  return text;
}

[[noreturn]] void end_job(NcclState& s, const std::string& message) {
  if (g_ending.exchange(true))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  std::fflush(stdout);
  std::fprintf(stderr, "modtrain: rank %d: %s\n", s.world_rank, message.c_str());
  std::fflush(stderr);
  abort_bounded(s.comm);
  s.host->abort("NCCL communicator on '" + s.name + "' aborted after the error above", 1);
  std::_Exit(1);  // not reached: abort() ends the process (GCC cannot see through the virtual)
}

void NcclState::check(ncclResult_t rc, const char* call, const char* what) {
  if (rc == ncclInProgress && comm != nullptr && !settle(comm, rc, deadline_after(timeout_s)))
    end_job(*this, "NCCL " + where(what) + " timed out after " + seconds_str(timeout_s) + "s in " +
                       call_name(call) + ": a peer rank has probably exited or is stuck");
  if (rc != ncclSuccess)
    throw std::runtime_error("NCCL: " + call_name(call) + " failed in " + where(what) + ": " +
                             nccl_error(rc, comm));
}

NcclState::~NcclState() {
  if (comm != nullptr) {
    // ncclCommFinalize flushes the communicator; non-blocking, it returns ncclInProgress until
    // done. Past the timeout, or after a failure, ncclCommAbort frees it without peers.
    ncclResult_t rc = clean ? ncclCommFinalize(comm) : ncclInternalError;
    if (rc == ncclInProgress) settle(comm, rc, deadline_after(timeout_s));
    if (rc == ncclSuccess)
      ncclCommDestroy(comm);
    else
      abort_bounded(comm);
  }
  if (ready != nullptr) cudaEventDestroy(ready);
  if (stream != nullptr) cudaStreamDestroy(stream);  // returns at once; freed once idle
}

}  // namespace mod::parallel::nccl
