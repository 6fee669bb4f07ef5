// Signal flag for graceful stops (see stop_signal.h).
#include "core/train/stop_signal.h"

#include <csignal>

namespace mod::train {

namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and writes resume instead of failing with EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal_received() { return g_signal; }
void clear_stop_signal() { g_signal = 0; }

}  // namespace mod::train
