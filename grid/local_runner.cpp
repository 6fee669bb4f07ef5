// Child processes under supervision (see local_runner.h).
#include "grid/local_runner.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace mod::grid {

namespace {
std::atomic<pid_t> g_child{0};
volatile std::sig_atomic_t g_signal = 0;

// SIGINT, SIGTERM, SIGUSR1: the running point checkpoints and exits 75, then run stops. The
// child always gets SIGUSR1: the trainer treats it as SIGTERM, and mpirun passes it on to every
// rank (on SIGTERM mpirun would end the ranks itself).
void forward_signal(int sig) {
  g_signal = sig;
  const pid_t child = g_child.load();
  if (child > 0) ::kill(child, SIGUSR1);
}

}  // namespace

void forward_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

int stop_signal() {
  return g_signal;
}

// The child gets its own process group, so a terminal's Ctrl-C reaches only this process, which
// turns it into a graceful stop; the child gets SIGTERM if this process dies.
int run_logged(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "modtrain grid run: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  g_child = pid;
  if (g_signal) ::kill(pid, SIGUSR1);  // arrived during fork
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  g_child = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_lines(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) out += "    " + l + "\n";
  return out;
}

}  // namespace mod::grid
