#!/usr/bin/env bash
# modtrain across two "hosts" on one machine: two network namespaces joined by a veth pair,
# mpirun in the first with a hostfile of both addresses and netns_agent.sh in place of ssh, the
# TCP transport only, pinned to the veth subnet. One scenario per call (CTest multihost:*):
#   communicators  communicator_tests under -n 2 (one rank per host) and -n 4 (two per host)
#   parity         parity_tests across hosts (dp2, tp2 against one process); a dp2 training run
#                  across hosts is bit-identical to the same run on one host
#   resume         SIGUSR1 stops a run across hosts at a checkpoint; it resumes on one host
#   sbatch_line    cluster/train_multi_node.sbatch, unchanged, with MOD_LAUNCHER=mpirun
#   kill_rank      kill -9 of host b's rank: rank 0 names the lost peer; the job ends in seconds
#   link_down      host b's link goes down mid-collective: every rank names the collective and
#                  group, the job ends within MOD_COLLECTIVE_TIMEOUT_S + a few s, nothing is left
#   rate_limit     a tbf-limited link: slower, same losses and weights
# After every fault the last checkpoint resumes on one host to the uninterrupted run's weights.
# Invariant: the hosts' addresses exist only inside the namespaces made here, and the EXIT trap
# kills every process left in them and deletes them, pass or fail. Exits 77 (skipped) when no
# namespace can be made (not root, no CAP_NET_ADMIN).
# Usage: multihost_test.sh MODTRAIN SOURCE_DIR MPIEXEC SCENARIO [TEST_BINARY]
set -euo pipefail
modtrain=$1
src=$2
mpiexec=$3
scenario=$4
test_binary=${5:-}
agent=$(cd "$(dirname "$0")" && pwd)/netns_agent.sh
say() { echo "multihost[$scenario]: $*"; }
fail() { echo "multihost[$scenario]: FAIL: $*" >&2; exit 1; }

# Names unique to this process, so scenarios run side by side (ctest -j); the subnet can repeat,
# as each pair of namespaces has its own routing.
ns_a=mod_mh_$$_a ns_b=mod_mh_$$_b veth_a=mh$$a veth_b=mh$$b
subnet=10.77.0.0/24 addr_a=10.77.0.1 addr_b=10.77.0.2
work=$(mktemp -d)
made=()

processes_in() { ip netns pids "$1" 2> /dev/null | tr '\n' ' '; }
cleanup() {
  local rc=$? ns pids
  set +e
  for ns in "${made[@]}"; do
    pids=$(processes_in "$ns")
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -9 $pids 2> /dev/null
  done
  for ns in "${made[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(processes_in "$ns")" ] && break; sleep 0.1; done
    ip netns del "$ns"
  done
  ip link del "$veth_a" 2> /dev/null  # only there if setup failed before it moved
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespaces of an earlier run that was killed outright (SIGKILL, e.g. a CTest timeout, leaves
# no trap to run): their test process is gone, so take them down too.
sweep_stale() {
  local ns pid
  for ns in $(ip netns list 2> /dev/null | sed -n 's/^\(mod_mh_[0-9]*_[ab]\).*/\1/p'); do
    pid=${ns#mod_mh_}
    pid=${pid%_*}
    [ -d "/proc/$pid" ] && continue
    # shellcheck disable=SC2046
    kill -9 $(ip netns pids "$ns") 2> /dev/null || true
    ip netns del "$ns" 2> /dev/null || true
  done
}
sweep_stale

if ! ip netns add "$ns_a" 2> "$work/netns.err"; then
  say "SKIP: cannot make a network namespace ($(cat "$work/netns.err")); run as root or with CAP_NET_ADMIN"
  exit 77
fi
made+=("$ns_a")
ip netns add "$ns_b"
made+=("$ns_b")
ip link add "$veth_a" type veth peer name "$veth_b"
ip link set "$veth_a" netns "$ns_a"
ip link set "$veth_b" netns "$ns_b"
ip -n "$ns_a" addr add "$addr_a/24" dev "$veth_a"
ip -n "$ns_b" addr add "$addr_b/24" dev "$veth_b"
for side in "$ns_a $veth_a" "$ns_b $veth_b"; do
  set -- $side  # namespace, interface
  ip -n "$1" link set lo up
  ip -n "$1" link set "$2" up
  # Give up on a dead TCP peer after ~3 s instead of ~15 min: otherwise mpirun and the remote
  # daemon outlive modtrain's own timeout when the link goes down.
  ip netns exec "$1" sysctl -q -w net.ipv4.tcp_retries2=3
done
printf '%s %s\n%s %s\n' "$addr_a" "$ns_a" "$addr_b" "$ns_b" > "$work/hosts"
printf '%s slots=2\n%s slots=2\n' "$addr_a" "$addr_b" > "$work/hostfile"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Across hosts: Open MPI's settings as environment variables, so a launch line (the sbatch
# script's) runs unchanged. Remote ranks see only what mpirun forwards (-x).
cross_env=(MOD_NETNS_HOSTS="$work/hosts" OMPI_MCA_plm_rsh_agent="$agent"
  OMPI_MCA_plm_rsh_no_tree_spawn=1 OMPI_MCA_orte_default_hostfile="$work/hostfile"
  OMPI_MCA_btl="tcp,self" OMPI_MCA_btl_tcp_if_include="$subnet"
  OMPI_MCA_oob_tcp_if_include="$subnet")
on_host_a() { ip netns exec "$ns_a" env "${cross_env[@]}" "$@"; }
mpirun_across() { on_host_a "$mpiexec" -x OMP_NUM_THREADS -x MOD_COLLECTIVE_TIMEOUT_S "$@"; }
# One host: the machine's own namespace, loopback only.
mpirun_local() {
  "$mpiexec" --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo --oversubscribe "$@"
}
export MOD_COLLECTIVE_TIMEOUT_S=${MOD_COLLECTIVE_TIMEOUT_S:-60}

# Rank 0 on host a, rank 1 on host b, each in its own namespace.
mpirun_across -n 2 --map-by node sh -c \
  'echo "$OMPI_COMM_WORLD_RANK $(ip netns identify $$)"' | sort > "$work/placement"
printf '0 %s\n1 %s\n' "$ns_a" "$ns_b" | cmp -s - "$work/placement" ||
  fail "ranks are not one per namespace: $(cat "$work/placement")"

steps=150
cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null
model=(--data "$work/data" --set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128
  --set model.n_layers=2 --set model.seq_len=64 --set optimizer.warmup_steps=5)
small=(--config "$src/configs/recipes/tiny_mod.textproto" "${model[@]}" --set "train.steps=$steps"
  --set train.eval_every=50 --set checkpoint.every_steps=50 --set parallel.dp=2)
losses() { cut -d, -f1,2 "$1/metrics.csv"; }
rows() { if [ -f "$1/metrics.csv" ]; then echo $(($(wc -l < "$1/metrics.csv") - 1)); else echo 0; fi; }
now() { date +%s.%N; }
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# The uninterrupted run every other run is held to: dp2 on one host.
reference() {
  mpirun_local -n 2 "$modtrain" train "${small[@]}" --run-dir "$work/reference" \
    > "$work/reference.log" 2>&1 || fail "the one-host reference run failed: $(tail "$work/reference.log")"
}
same_as_reference() {  # same_as_reference RUN_DIR WHAT
  cmp -s <(losses "$work/reference") <(losses "$1") ||
    fail "$2: losses differ from the one-host run: $(diff <(losses "$work/reference") <(losses "$1") | head -5)"
  cmp -s "$work/reference/model.safetensors" "$1/model.safetensors" ||
    fail "$2: final weights differ from the one-host run"
}
# Waits until RUN_DIR has a checkpoint and more than MIN rows of metrics (the run is mid-way).
wait_midway() {  # wait_midway RUN_DIR MIN
  for _ in $(seq 1 1200); do
    [ -f "$1/checkpoints/latest" ] && [ "$(rows "$1")" -gt "$2" ] && return 0
    sleep 0.05
  done
  fail "no checkpoint and $2 steps in $1 after 60 s"
}
# The last checkpoint of a broken run resumes on one host and ends on the reference's weights.
resume_on_one_host() {  # resume_on_one_host RUN_DIR WHAT
  local at
  at=$(cat "$1/checkpoints/latest")
  [ "$at" != "step_$(printf %08d $steps)" ] || fail "$2: the run finished before the fault; nothing tested"
  mpirun_local -n 2 "$modtrain" train "${small[@]}" --run-dir "$1" --resume auto \
    > "$work/resume.log" 2>&1 || fail "$2: resume from $at failed: $(tail "$work/resume.log")"
  grep -q "resumed from .*$at" "$work/resume.log" || fail "$2: did not resume from $at"
  cmp -s "$work/reference/model.safetensors" "$1/model.safetensors" ||
    fail "$2: resumed from $at, the final weights differ from the uninterrupted run"
  say "$2: the last checkpoint ($at) resumed on one host to the uninterrupted run's weights"
}
# No process of the job may be left in either namespace (ranks, orted, mpirun).
nothing_left() {  # nothing_left WHAT
  local left=""
  for _ in $(seq 1 20); do
    left="$(processes_in "$ns_a")$(processes_in "$ns_b")"
    [ -z "${left// /}" ] && return 0
    sleep 0.1
  done
  fail "$1: processes left in the namespaces: $(ps -o pid,args -p "${left// /,}" | tail -n +2)"
}
# A dp2 run across hosts in the background: sets job (mpirun's pid) and job_start.
start_across() {  # start_across RUN_DIR LOG [extra modtrain args]
  local run=$1 log=$2
  shift 2
  # A simple command, so $! is mpirun itself (ip and env exec it) and signals reach it.
  ip netns exec "$ns_a" env "${cross_env[@]}" "$mpiexec" -x OMP_NUM_THREADS \
    -x MOD_COLLECTIVE_TIMEOUT_S -n 2 --map-by node "$modtrain" train "${small[@]}" \
    --run-dir "$run" --rank-logs "$run/logs" "$@" > "$log" 2>&1 &
  job=$!
  job_start=$(now)
}
finish() {  # finish PID: waits, sets rc
  set +e; wait "$1"; rc=$?; set -e
}

case $scenario in
  communicators)
    [ -x "$test_binary" ] || fail "usage: ... communicators COMMUNICATOR_TESTS"
    mpirun_across -n 2 --map-by node "$test_binary" --use-colour no > "$work/np2.log" 2>&1 ||
      fail "communicator_tests -n 2 across hosts: $(tail -20 "$work/np2.log")"
    mpirun_across -n 4 "$test_binary" --use-colour no > "$work/np4.log" 2>&1 ||
      fail "communicator_tests -n 4 across hosts: $(tail -20 "$work/np4.log")"
    say "communicator_tests passed with 2 ranks (1 per host) and 4 (2 per host)"
    ;;
  parity)
    [ -x "$test_binary" ] || fail "usage: ... parity PARITY_TESTS"
    mpirun_across -n 2 --map-by node "$test_binary" --use-colour no > "$work/parity.log" 2>&1 ||
      fail "parity_tests across hosts: $(tail -20 "$work/parity.log")"
    reference
    mpirun_across -n 2 --map-by node "$modtrain" train "${small[@]}" --run-dir "$work/across" \
      > "$work/across.log" 2>&1 || fail "dp2 across hosts failed: $(tail "$work/across.log")"
    same_as_reference "$work/across" "dp2 across hosts"
    say "parity_tests (dp2, tp2 against one process) passed across hosts; dp2 across hosts is bit-identical to dp2 on one host"
    ;;
  resume)
    reference
    start_across "$work/run" "$work/run.log"
    wait_midway "$work/run" 60
    kill -USR1 "$job"
    finish "$job"
    [ "$rc" -eq 75 ] || fail "SIGUSR1 to mpirun: exit $rc, expected 75: $(tail "$work/run.log")"
    resume_on_one_host "$work/run" "stopped across hosts"
    ;;
  sbatch_line)
    reference
    # MOD_MODTRAIN may name any binary: this one records what each rank's environment says.
    cat > "$work/modtrain" <<EOF
#!/bin/sh
echo "rank=\$OMPI_COMM_WORLD_RANK local_rank=\$OMPI_COMM_WORLD_LOCAL_RANK size=\$OMPI_COMM_WORLD_SIZE netns=\$(ip netns identify \$\$)" > "$work/env_\$OMPI_COMM_WORLD_RANK"
exec "$modtrain" "\$@"
EOF
    chmod +x "$work/modtrain"
    # What Slurm would set on the first of two nodes, one task each; no SLURM_JOBID, so
    # Open MPI uses the hostfile and the agent instead of srun.
    mkdir -p "$work/submit"
    on_host_a env SLURM_SUBMIT_DIR="$work/submit" MOD_REPO="$src" SLURM_JOB_NAME=multihost \
      SLURM_JOB_ID=1 SLURM_NTASKS=2 SLURM_NTASKS_PER_NODE=1 SLURM_CPUS_PER_TASK=1 \
      SLURM_JOB_NODELIST="$addr_a,$addr_b" MOD_LAUNCHER=mpirun MOD_MODTRAIN="$work/modtrain" \
      MOD_CONFIG="$src/configs/recipes/tiny_mod.textproto" MOD_RUN_DIR="$work/sbatch_run" \
      PATH="$(dirname "$mpiexec"):$PATH" \
      bash "$src/cluster/train_multi_node.sbatch" "${small[@]:2}" > "$work/sbatch.log" 2>&1 ||
      fail "train_multi_node.sbatch failed: $(tail "$work/sbatch.log")"
    grep -q "starting: mpirun -np 2 --map-by ppr:1:node:PE=1" "$work/sbatch.log" ||
      fail "the script did not launch with mpirun: $(grep starting "$work/sbatch.log")"
    for r in 0 1; do
      ns=$([ $r = 0 ] && echo "$ns_a" || echo "$ns_b")
      grep -qx "rank=$r local_rank=0 size=2 netns=$ns" "$work/env_$r" ||
        fail "rank $r saw: $(cat "$work/env_$r"), expected rank $r, local rank 0 on $ns"
    done
    grep -q "^step" "$work/sbatch_run/rank_logs/job_1_restart_0/rank_1.log" ||
      fail "rank 1 on host b wrote no rank log"
    same_as_reference "$work/sbatch_run" "the sbatch launch line across hosts"
    say "train_multi_node.sbatch's mpirun line ran unchanged: rank 0 and 1 on two hosts, local rank 0 each, same weights as one host"
    ;;
  kill_rank)
    reference
    start_across "$work/run" "$work/run.log"
    wait_midway "$work/run" 60
    victim=""
    for pid in $(processes_in "$ns_b"); do
      [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = modtrain ] && victim=$pid
    done
    [ -n "$victim" ] || fail "no modtrain process in $ns_b"
    killed=$(now)
    kill -9 "$victim"
    finish "$job"
    took=$(seconds_since "$killed")
    [ "$rc" -ne 0 ] || fail "the job succeeded although rank 1 was killed"
    awk -v t="$took" 'BEGIN { exit !(t <= 15) }' || fail "the job took ${took}s to end after kill -9"
    grep -E "modtrain: rank 0: lost peer rank 1 \\(host [^)]*$addr_b\\)" \
      "$work/run.log" > "$work/message" || fail "rank 0 did not name the lost peer: $(cat "$work/run.log")"
    nothing_left "kill -9"
    say "kill -9 of rank 1: job ended in ${took}s (exit $rc); $(cat "$work/message")"
    resume_on_one_host "$work/run" "after kill -9"
    ;;
  link_down)
    timeout_s=3
    reference
    MOD_COLLECTIVE_TIMEOUT_S=$timeout_s start_across "$work/run" "$work/run.log"
    wait_midway "$work/run" 60
    down=$(now)
    ip -n "$ns_b" link set "$veth_b" down
    finish "$job"
    took=$(seconds_since "$down")
    [ "$rc" -ne 0 ] || fail "the job succeeded although the link went down"
    nothing_left "link down"
    took_all=$(seconds_since "$down")
    awk -v t="$took_all" -v l="$timeout_s" 'BEGIN { exit !(t <= l + 8) }' ||
      fail "the job took ${took_all}s to end after the link went down (timeout ${timeout_s}s)"
    pattern="did not complete in $timeout_s s: .*group of world ranks \[0,1\]"
    grep -E "modtrain: rank 0: [a-z_]+ on '[a-z]+' \(rank 0 of 2\) $pattern" "$work/run.log" \
      > "$work/message0" || fail "rank 0 did not name the collective and group: $(cat "$work/run.log")"
    grep -E "modtrain: rank 1: [a-z_]+ on '[a-z]+' \(rank 1 of 2\) $pattern" \
      "$work/run/logs/rank_1.log" > "$work/message1" ||
      fail "rank 1 did not name the collective and group: $(tail -5 "$work/run/logs/rank_1.log")"
    say "link down: mpirun exited $rc after ${took}s, nothing left after ${took_all}s"
    say "  $(cat "$work/message0")"
    say "  $(cat "$work/message1")"
    resume_on_one_host "$work/run" "after the link went down"
    ;;
  rate_limit)
    reference
    start_across "$work/fast" "$work/fast.log"
    finish "$job"
    [ "$rc" -eq 0 ] || fail "the unlimited run across hosts failed: $(tail "$work/fast.log")"
    fast=$(seconds_since "$job_start")
    for side in "$ns_a $veth_a" "$ns_b $veth_b"; do
      set -- $side
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate 100mbit burst 32kb latency 100ms
    done
    start_across "$work/run" "$work/run.log"
    finish "$job"
    slow=$(seconds_since "$job_start")
    [ "$rc" -eq 0 ] || fail "the rate-limited run failed: $(tail "$work/run.log")"
    overlimits=$(ip netns exec "$ns_a" tc -s qdisc show dev "$veth_a" | sed -n 's/.*overlimits \([0-9]*\).*/\1/p')
    [ "${overlimits:-0}" -gt 0 ] || fail "tbf never held a packet back: the limit was not exercised"
    same_as_reference "$work/run" "rate-limited link"
    say "100 Mbit/s tbf: ${slow}s against ${fast}s unlimited ($overlimits packets held back), same losses and weights"
    # Its last-but-one checkpoint resumes on one host as well.
    mkdir -p "$work/again/checkpoints"
    cp -r "$work/run/checkpoints/step_00000100" "$work/again/checkpoints/"
    echo step_00000100 > "$work/again/checkpoints/latest"
    resume_on_one_host "$work/again" "rate-limited link"
    ;;
  *) fail "unknown scenario '$scenario'" ;;
esac
say "passed"
