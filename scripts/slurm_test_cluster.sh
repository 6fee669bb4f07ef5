#!/usr/bin/env bash
# A one-node Slurm cluster on localhost for tests and for trying the sbatch scripts by hand:
# its own munged, slurmctld and slurmd (as root), all state, sockets and logs under one
# directory, clients pointed at it with SLURM_CONF; /etc/slurm and /etc/munge stay untouched.
# Invariant: after `stop` none of its processes run and its directory is gone; `start` and
# `stop` may be repeated. Installs nothing (scripts/install_deps.sh does).
#
# Usage: slurm_test_cluster.sh {start|stop|status|env}
#   start   write the config, start the daemons, wait until the node is idle (exit 0), or print
#           why not with the daemons' logs (exit 1; exit 2 when a binary is missing)
#   stop    cancel every job, stop the daemons and their job processes, remove the directory
#   status  the daemons and `sinfo`; exit 0 when the node is up
#   env     prints `export SLURM_CONF=...`, for `eval "$(scripts/slurm_test_cluster.sh env)"`
# Environment: MOD_SLURM_DIR (default /tmp/modtrain-slurm), MOD_SLURM_PORT (slurmctld's port,
# default 26817; slurmd takes the next), MOD_SLURM_START_TIMEOUT_S (default 60).
set -euo pipefail

dir=${MOD_SLURM_DIR:-/tmp/modtrain-slurm}
ctld_port=${MOD_SLURM_PORT:-26817}
slurmd_port=$((ctld_port + 1))
start_timeout=${MOD_SLURM_START_TIMEOUT_S:-60}
conf=$dir/etc/slurm.conf
munge_socket=$dir/munge/munge.socket.2
cluster=modtrain-test
export SLURM_CONF=$conf

say() { echo "slurm_test_cluster: $*"; }

# The pid in a pid file, if that process is alive.
live_pid() {
  local pid
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2> /dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null && echo "$pid"
}

daemons_up() {
  live_pid "$dir/run/munged.pid" > /dev/null && live_pid "$dir/run/slurmctld.pid" > /dev/null \
    && live_pid "$dir/run/slurmd.pid" > /dev/null
}

node_state() { timeout 10 sinfo -h -n localhost -o %t 2> /dev/null | head -n 1 || true; }

show_logs() {
  local f
  for f in "$dir"/log/munged.log "$dir"/log/slurmctld.log "$dir"/log/slurmd.log; do
    [ -f "$f" ] || { echo "--- $f: not written"; continue; }
    echo "--- last lines of $f"
    tail -n 25 "$f"
  done
}

# Slurm's plugin directory, where this Slurm keeps mpi_pmix.so (Debian: <libdir>/slurm-wlm).
plugin_dir() {
  local d
  for d in /usr/lib/*/slurm-wlm /usr/lib64/slurm /usr/lib/slurm /usr/local/lib/slurm; do
    [ -f "$d/proctrack_linuxproc.so" ] && { echo "$d"; return 0; }
  done
  return 1
}

# pmix when Slurm has the plugin and the libpmix.so it dlopens (Debian: libpmix-dev).
mpi_default() {
  local d
  if d=$(plugin_dir) && [ -f "$d/mpi_pmix.so" ] && ldconfig -p | grep -q 'libpmix\.so '; then
    echo pmix
  else
    echo none
  fi
}

write_config() {
  local cpus mem_mb
  cpus=$(nproc)
  # Memory slurmd may report: all of it less a margin (Slurm drains a node reporting less).
  mem_mb=$(free -m | awk '/^Mem:/ { m = $2 - 512; print (m > 256 ? m : 256) }')
  mkdir -p "$dir"/{etc,state,spool,log,run,munge}
  chmod 755 "$dir" "$dir/munge"  # munged insists that its socket's directory be searchable
  cat > "$conf" << EOF
# Written by scripts/slurm_test_cluster.sh: a one-node test cluster on localhost.
ClusterName=$cluster
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged; cred_expire is also how long a requeued job waits before it may start again.
AuthInfo=socket=$munge_socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: they are rarely writable in a container.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# One line per finished job (and per requeued run), kept after slurmctld forgets the job.
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Look at pending jobs every second: a requeued job starts again soon after cred_expire.
SchedulerParameters=bf_interval=1,sched_interval=1
MpiDefault=$(mpi_default)
JobRequeue=1
ReturnToService=2
KillWait=5
MinJobAge=600
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=30
MailProg=/bin/true
# A job in \`urgent\` preempts jobs in \`test\`: they get SIGTERM and GraceTime seconds to
# checkpoint, then Slurm requeues them.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30
PartitionName=urgent Nodes=localhost MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
EOF
  # Read by slurmd in any case; no plugin of ours uses cgroups, so keep it from probing them.
  cat > "$dir/etc/cgroup.conf" << EOF
CgroupAutomount=no
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
  : > "$dir/etc/plugstack.conf"
}

start_munged() {
  if [ ! -f "$dir/munge/munge.key" ]; then
    mungekey --create --keyfile="$dir/munge/munge.key" 2> /dev/null \
      || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 600 "$dir/munge/munge.key"
  MOD_SLURM_DAEMON=$dir munged --socket="$munge_socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed"
}

cmd_start() {
  local missing=() b
  for b in munged munge slurmctld slurmd sinfo sbatch srun scontrol scancel squeue; do
    command -v "$b" > /dev/null || missing+=("$b")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "cannot start: not installed: ${missing[*]} (run scripts/install_deps.sh)"
    exit 2
  fi
  if [ "$(id -u)" -ne 0 ]; then
    say "cannot start: the daemons run as root here (SlurmUser=root); run as root"
    exit 2
  fi
  if daemons_up && [[ "$(node_state)" =~ ^(idle|mix|alloc) ]]; then
    say "already running ($dir)"
    return 0
  fi
  cmd_stop > /dev/null  # a half-started or stale cluster: start from nothing
  write_config
  start_munged || { say "munged failed to start"; show_logs; cmd_stop > /dev/null; exit 1; }
  # -i: ignore any saved state; both daemons fork and write their pid files.
  if ! MOD_SLURM_DAEMON=$dir slurmctld -i -f "$conf" \
    || ! MOD_SLURM_DAEMON=$dir slurmd -N localhost -f "$conf"; then
    say "slurmctld or slurmd failed to start"
    show_logs
    cmd_stop > /dev/null
    exit 1
  fi
  local deadline=$((SECONDS + start_timeout)) state=""
  while [ $SECONDS -lt "$deadline" ]; do
    state=$(node_state)
    [ "$state" = idle ] && break
    if ! daemons_up; then
      say "a daemon exited during start-up"
      cmd_status || true
      show_logs
      cmd_stop > /dev/null
      exit 1
    fi
    sleep 0.5
  done
  if [ "$state" != idle ]; then
    say "the node did not become idle within ${start_timeout}s (sinfo says '${state:-nothing}')"
    show_logs
    cmd_stop > /dev/null
    exit 1
  fi
  say "running: node localhost idle, $(nproc) CPUs, MpiDefault=$(mpi_default), state in $dir"
  say "clients: export SLURM_CONF=$conf"
}

# Processes left by our cluster: the daemons and slurmstepd (they carry MOD_SLURM_DAEMON=$dir,
# set only when we start them) and the jobs' processes (SLURM_CLUSTER_NAME and SLURM_CONF ours,
# set by Slurm in a job). Never the shell that runs this script, nor anything else.
our_processes() {
  local p env
  for p in /proc/[0-9]*; do
    env=$({ tr '\0' '\n' < "$p/environ"; } 2> /dev/null) || continue
    if grep -qxF "MOD_SLURM_DAEMON=$dir" <<< "$env" \
      || { grep -qxF "SLURM_CLUSTER_NAME=$cluster" <<< "$env" \
        && grep -qxF "SLURM_CONF=$conf" <<< "$env"; }; then
      echo "${p#/proc/}"
    fi
  done
}

# SIGTERM to the daemons of the given pid files at once, then SIGKILL to any left after 10 s.
stop_daemons() {  # stop_daemons PID_FILE...
  local f pid pids=() alive
  for f in "$@"; do
    pid=$(live_pid "$f") && pids+=("$pid")
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2> /dev/null || true
  for _ in $(seq 1 100); do
    alive=0
    for pid in "${pids[@]}"; do
      kill -0 "$pid" 2> /dev/null && alive=1
    done
    [ $alive -eq 1 ] || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do
    kill -9 "$pid" 2> /dev/null || true
  done
}

cmd_stop() {
  local pids
  if [ -f "$conf" ] && live_pid "$dir/run/slurmctld.pid" > /dev/null; then
    timeout 10 scancel --full --quiet --user=root 2> /dev/null || true
    for _ in $(seq 1 40); do  # jobs get KillWait (5 s) to end
      [ -z "$(timeout 5 squeue -h -o %i 2> /dev/null)" ] && break
      sleep 0.25
    done
  fi
  stop_daemons "$dir"/run/{slurmctld,slurmd,munged}.pid
  if [ -f "$conf" ]; then
    pids=$(our_processes)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086  # one pid per word
      kill -9 $pids 2> /dev/null || true
      sleep 0.2
    fi
  fi
  # Remove the directory only when it is ours (our slurm.conf in it), whatever MOD_SLURM_DIR says.
  if [ -f "$conf" ] && head -n 1 "$conf" | grep -q "scripts/slurm_test_cluster.sh"; then
    rm -rf "$dir"
    say "stopped; removed $dir"
  elif [ -e "$dir" ]; then
    say "stopped; left $dir alone: it holds no slurm.conf of this script"
  else
    say "stopped"
  fi
}

cmd_status() {
  local name pid rc=0
  for name in munged slurmctld slurmd; do
    if pid=$(live_pid "$dir/run/$name.pid"); then
      say "$name running (pid $pid)"
    else
      say "$name not running"
      rc=1
    fi
  done
  if [ $rc -eq 0 ]; then
    timeout 10 sinfo || rc=1
    timeout 10 squeue || true
  fi
  return $rc
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *)
    echo "usage: $0 {start|stop|status|env}" >&2
    exit 64
    ;;
esac
