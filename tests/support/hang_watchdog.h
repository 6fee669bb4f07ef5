// A Catch2 listener that every test binary's main includes (tests/main.cpp, cuda_main.cpp,
// mpi_main.cpp): a test case still running after MOD_TEST_HANG_S seconds (default 240, under
// CTest's TIMEOUT) prints its name and every thread's stack (offsets for `addr2line -Cfe BINARY`),
// once. CTest's TIMEOUT then ends it as a timeout; its own kill says nothing about where a test
// hung.
#pragma once
#include <dirent.h>
#include <execinfo.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace {

const int kStackSignal = SIGRTMIN + 3;

void print_stack(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  char line[64];
  const int len = std::snprintf(line, sizeof line, "--- thread %ld\n", long(syscall(SYS_gettid)));
  if (write(STDERR_FILENO, line, size_t(len)) < 0) return;
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
}

// Asks every other thread of the process to print its stack, one after another.
void dump_all_stacks() {
  std::signal(kStackSignal, print_stack);
  const long self = long(syscall(SYS_gettid));
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return;
  while (const dirent* e = readdir(dir)) {
    const long tid = std::atol(e->d_name);
    if (tid <= 0 || tid == self) continue;
    syscall(SYS_tgkill, long(getpid()), tid, kStackSignal);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  closedir(dir);
}

double hang_limit_s() {
  const char* v = std::getenv("MOD_TEST_HANG_S");
  const double s = v != nullptr ? std::atof(v) : 240.0;
  return s > 0 ? s : 240.0;
}

class HangWatchdog : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    std::lock_guard<std::mutex> lock(mutex_);
    name_ = info.name;
    deadline_ = clock::now() + std::chrono::duration_cast<clock::duration>(
                                   std::chrono::duration<double>(hang_limit_s()));
    armed_ = true;
    if (!thread_.joinable()) thread_ = std::thread([this] { watch(); });
    wake_.notify_all();
  }

  void testCaseEnded(const Catch::TestCaseStats&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
    wake_.notify_all();
  }

  void testRunEnded(const Catch::TestRunStats&) override { stop(); }
  ~HangWatchdog() override { stop(); }

 private:
  using clock = std::chrono::steady_clock;

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      wake_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!done_) {
      if (!armed_) {
        wake_.wait(lock);
        continue;
      }
      if (wake_.wait_until(lock, deadline_) == std::cv_status::timeout && armed_ && !done_ &&
          clock::now() >= deadline_) {
        std::fprintf(stderr,
                     "\nhang watchdog: test case '%s' still running after %.0f s "
                     "(MOD_TEST_HANG_S); every thread's stack follows\n",
                     name_.c_str(), hang_limit_s());
        std::fflush(stderr);
        dump_all_stacks();
        armed_ = false;  // once per case: the process may yet finish, or CTest ends it
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::thread thread_;
  std::string name_;
  clock::time_point deadline_{};
  bool armed_ = false;
  bool done_ = false;
};

}  // namespace

CATCH_REGISTER_LISTENER(HangWatchdog)
