// The NCCL watchdog (internal to parallel/nccl_*.cpp): one thread per process that watches
// every NCCL collective in flight. Invariant: a collective whose done-event fails, whose
// communicator reports an asynchronous error, or which passes its deadline ends the job
// (end_job) with a message naming it; finished ones are dropped.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/nccl_state.h"
#include "parallel/nccl_work.h"

namespace mod::parallel::nccl {

// One collective in flight, as the watchdog sees it.
struct InFlight {
  std::shared_ptr<NcclState> state;
  std::shared_ptr<Event> done;  // recorded on the comm stream after the collective
  const char* what;             // "all_reduce"
  Clock::time_point deadline;
};

// Every kPoll (nccl_watchdog.cpp) it checks each collective in flight; it sleeps while nothing
// is in flight.
class Watchdog {
 public:
  // Made, with its thread, on first use; leaked on purpose, since the detached thread may run
  // while static destructors do.
  static Watchdog& get();

  void watch(InFlight entry);
  // Drops `state`'s records (the caller has drained its stream) before it is torn down; after
  // this returns the watchdog no longer touches it.
  void forget(const NcclState* state);

 private:
  explicit Watchdog(int device);
  void run();

  int device_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<InFlight> entries_;
};

}  // namespace mod::parallel::nccl
