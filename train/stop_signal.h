// Graceful stop on SIGTERM or SIGUSR1 (Slurm's --signal, scancel, a preemption notice). The
// handler only sets a flag; the trainer reduces it over every rank once per step, so all ranks
// agree to finish the step, checkpoint and exit with kExitCheckpointedStop. A second signal
// while the checkpoint is written only sets the flag again: nothing is interrupted.
#pragma once

namespace mod::train {

// Exit status of a run stopped by a signal after its checkpoint was committed (EX_TEMPFAIL:
// "try again"); a requeued job started with --resume auto continues from it.
constexpr int kExitCheckpointedStop = 75;

// Installs the handlers for SIGTERM and SIGUSR1 (idempotent), and blocks both in the calling
// thread, so in every thread it creates later, for one waiting thread to take them: call it
// before any other thread starts (modtrain train does, first thing), so that no compute
// thread is ever interrupted.
// with_sigint: SIGINT (Ctrl-C) stops too (modtrain prep; the trainer keeps Ctrl-C's default).
void install_stop_handlers(bool with_sigint = false);
// The signal received on this process, or 0.
int stop_signal_received();
// Forgets a received signal (tests run several trainings in one process).
void clear_stop_signal();

}  // namespace mod::train
