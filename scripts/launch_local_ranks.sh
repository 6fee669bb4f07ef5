#!/usr/bin/env bash
# launch_local_ranks.sh N [--nccl-hostids] [--port P] -- COMMAND ARGS...
# Starts N processes of COMMAND on this machine as the ranks of one job without MPI, the way
# torchrun would: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1,
# MASTER_PORT (a free port, or P) and one fresh MOD_RENDEZVOUS_TOKEN, so modtrain's ranks meet
# through the TCP rendezvous (docs/parallel.md, "Starting without MPI").
#   --nccl-hostids  gives each rank its own NCCL_HOSTID, with NCCL_SOCKET_IFNAME=lo and
#                   NCCL_IB_DISABLE=1: NCCL then takes each rank for another node and joins them
#                   over its socket transport on loopback, so N ranks can share one GPU.
# Waits for every rank; when one fails the others are stopped (TERM, KILL 10 s later), and the
# exit status is the first failure's (0 when all succeed). LAUNCH_DRY_RUN=1 prints each rank's
# variables and command instead of running them.
set -uo pipefail
usage="usage: $0 N [--nccl-hostids] [--port P] -- COMMAND ARGS..."
n=${1:-}
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "$usage (N must be a positive number, got '$n')" >&2; exit 2; }
shift
hostids=0
port=
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --nccl-hostids) hostids=1 ;;
    --port) port=${2:-}; shift ;;
    *) echo "$usage (unknown option '$1')" >&2; exit 2 ;;
  esac
  shift
done
[ "${1:-}" = "--" ] && [ $# -ge 2 ] || { echo "$usage (no command after --)" >&2; exit 2; }
shift
if [ -z "$port" ]; then  # a port the kernel says is free now
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
fi
[[ $port =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] ||
  { echo "$usage (--port '$port' is not a TCP port)" >&2; exit 2; }
token="local-$$-$(date +%s%N)"

rank_env() {  # the variables of rank $1, as env(1) arguments
  local r=$1
  echo "RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1" \
    "MASTER_PORT=$port MOD_RENDEZVOUS_TOKEN=$token"
  [ $hostids -eq 1 ] && echo "NCCL_HOSTID=modtrain-rank-$r NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1"
}

if [ "${LAUNCH_DRY_RUN:-0}" = 1 ]; then
  for ((r = 0; r < n; r++)); do echo "rank $r: $(rank_env $r | paste -sd' ') $*"; done
  exit 0
fi

declare -A rank_of
pids=()
for ((r = 0; r < n; r++)); do
  # shellcheck disable=SC2046  # the variables split into env's arguments on purpose
  env $(rank_env $r) "$@" &
  pids+=($!)
  rank_of[$!]=$r
done

stop_all() {
  kill -TERM "${pids[@]}" 2>/dev/null
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || return
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null
}
trap 'stop_all; exit 130' INT TERM

first_rc=0
left=$n
while [ $left -gt 0 ]; do
  wait -n -p done_pid
  rc=$?
  [ -n "${done_pid:-}" ] || break
  left=$((left - 1))
  if [ $rc -ne 0 ] && [ $first_rc -eq 0 ]; then
    first_rc=$rc
    echo "launch_local_ranks: rank ${rank_of[$done_pid]} exited with status $rc; stopping the others" >&2
    stop_all
  fi
done
exit $first_rc
