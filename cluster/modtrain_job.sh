# shellcheck shell=bash
# Sourced by cluster/train_*.sbatch inside the batch script (and by a grid's job array, as the
# copy `modtrain grid submit` writes beside it): starts the training step, passes
# USR1/TERM on to it, and decides from its exit status whether the job requeues itself.
# Invariant: a run that stopped with a checkpoint (exit 75) while its job was still RUNNING is
# put back in the queue once, by `scontrol requeue`; a job Slurm already requeued (preemption
# without grace time) is not requeued again. The requeued job's `--resume auto` continues from
# that checkpoint.

MOD_EXIT_STOPPED=75  # modtrain train: stopped on SIGTERM/SIGUSR1 after writing a checkpoint

mod_log() { echo "modtrain_job: $(date +%H:%M:%S) job ${SLURM_JOB_ID:-?}: $*"; }

# The value of FIELD in `scontrol show job` for this job (empty when Slurm cannot say).
mod_job_field() {
  scontrol show job "$SLURM_JOB_ID" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$1=//p" | head -n 1
}

# mod_run_step COMMAND...: runs the launcher (srun or mpirun) in the background and waits for
# it, passing USR1 on (from `--signal=B:USR1@...` or `scancel --batch --signal=USR1`); srun and
# mpirun forward it to every rank. TERM is sent by Slurm to the ranks as well, so the shell only
# notes it and keeps waiting for the checkpoint. Sets mod_rc to the launcher's exit status.
mod_run_step() {
  local pid again
  mod_pid=""
  trap 'mod_log "got USR1: passing it to the ranks (checkpoint and stop)"
        [ -n "$mod_pid" ] && kill -USR1 "$mod_pid" 2> /dev/null' USR1
  trap 'mod_log "got TERM: the ranks checkpoint and stop"' TERM
  mod_log "starting: $*"
  "$@" &
  pid=$!
  mod_pid=$pid
  while :; do
    mod_rc=0
    wait "$pid" || mod_rc=$?
    # Above 128 either the launcher died of a signal or a trap interrupted `wait`: wait again
    # while it runs, and once more to collect a status bash kept while a trap ran (127: none).
    [ "$mod_rc" -gt 128 ] || break
    kill -0 "$pid" 2> /dev/null && continue
    again=0
    wait "$pid" 2> /dev/null || again=$?
    [ "$again" -ne 127 ] && mod_rc=$again
    break
  done
  # A late signal must not kill the shell before it has decided about the requeue.
  trap 'mod_log "got USR1 after the training step ended"' USR1
  trap 'mod_log "got TERM after the training step ended"' TERM
  mod_log "the training step exited with status $mod_rc"
}

# mod_finish_job STATUS: ends the batch script. 0: done. 75: the ranks checkpointed and
# stopped; while the job is still RUNNING (USR1 before the time limit, a manual signal, or
# SIGTERM within a preemption's GraceTime) it requeues itself. Slurm has already requeued a job
# preempted without grace time, and a job cancelled or past its time limit is no longer RUNNING:
# those are left alone. Anything else: the job fails with that status.
mod_finish_job() {
  local rc=$1 state preempt
  if [ "$rc" -eq 0 ]; then
    mod_log "training finished"
    exit 0
  fi
  if [ "$rc" -ne "$MOD_EXIT_STOPPED" ]; then
    mod_log "training failed (status $rc); not requeued"
    exit "$rc"
  fi
  state=$(mod_job_field JobState)
  preempt=$(mod_job_field PreemptTime)
  [ "${preempt:-None}" = None ] || mod_log "the job was preempted at $preempt"
  if [ "$state" = RUNNING ]; then
    mod_log "checkpointed and stopped; requeuing (restart $((${SLURM_RESTART_COUNT:-0} + 1)))"
    if scontrol requeue "$SLURM_JOB_ID"; then
      exit 0  # Slurm ends this run of the job now; the requeued run resumes from the checkpoint
    fi
    mod_log "scontrol requeue failed; resubmit this script to resume from the checkpoint"
  else
    mod_log "checkpointed and stopped; the job is ${state:-gone} (requeued by Slurm, cancelled" \
      "or out of time), so it is not requeued from here; resubmit to resume if need be"
  fi
  exit "$rc"
}
