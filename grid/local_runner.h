// Supervision of the processes `modtrain grid` starts on this machine (the trainer for `grid
// run`, sbatch for `grid submit`): one child at a time, its output appended to a log file.
// Invariant: once forward_stop_signals() is installed, a SIGINT, SIGTERM or SIGUSR1 to this
// process reaches the running child as SIGUSR1 (the trainer's graceful stop, which mpirun passes
// on to every rank) and is remembered in stop_signal(); the child never outlives this process.
#pragma once

#include <string>
#include <vector>

namespace mod::grid {

// Installs the handlers for SIGINT, SIGTERM and SIGUSR1 described above.
void forward_stop_signals();

// The last stop signal received since forward_stop_signals(); 0 when none.
int stop_signal();

// Runs args (args[0] an absolute path) with stdout and stderr appended to log, in a process
// group of its own, and waits for it; returns its exit status (128 + signal when killed).
int run_logged(const std::vector<std::string>& args, const std::string& log);

// The last n lines of a text file, each indented by four spaces (for failure reports).
std::string last_lines(const std::string& path, int n);

}  // namespace mod::grid
