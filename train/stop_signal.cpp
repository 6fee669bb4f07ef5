// Signal flag for graceful stops (see stop_signal.h).
#include "train/stop_signal.h"

#include <pthread.h>

#include <csignal>
#include <mutex>
#include <thread>

namespace mod::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }

sigset_t stop_signals(bool with_sigint) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  if (with_sigint) sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void install_stop_handlers(bool with_sigint) {
  static std::once_flag once;
  std::call_once(once, [with_sigint] {
    // The handler serves threads that existed before this call (they keep the signals
    // unblocked); SA_RESTART makes their blocking reads and writes resume instead of failing.
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, nullptr);
    sigaction(SIGUSR1, &sa, nullptr);
    if (with_sigint) sigaction(SIGINT, &sa, nullptr);
    // Every thread created from here on (OpenMP's, MPI's) inherits the block, and one thread
    // takes the signals with sigwait. A handler run on a compute thread would push its frame
    // at that thread's stack pointer, which oneDNN 2.x's JIT SGEMM points into the heap while
    // it runs: the frame overwrote heap memory (oneDNN issue 4845; seen here as aborts in 1 of
    // 5 stops). Blocked threads are never interrupted.
    const sigset_t set = stop_signals(with_sigint);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) == 0) g_signal = sig;
      }
    }).detach();
  });
}

int stop_signal_received() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }

}  // namespace mod::train
