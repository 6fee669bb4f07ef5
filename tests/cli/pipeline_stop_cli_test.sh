#!/usr/bin/env bash
# `mpirun -np 2 modtrain train` at parallel.pp 2 (tiny_dense shrunk, 4 micro-batches):
# - the end-of-run summary prints the measured pipeline bubble (total and per stage, each inside
#   (0, 1)) beside the prediction;
# - SIGTERM to stage 1 alone, mid-step: both stages stop after the same step, the job exits 75,
#   the checkpoint records pp 2, and `--resume auto` under pp 2 ends with the per-step losses and
#   final weights of an uninterrupted run, bit for bit (every stage reads every tensor by global
#   name, so one a stage failed to write fails the resume);
# - metrics.csv has the step's measured bubble (pp_bubble) inside (0, 1) on every row;
# - interleaved 1F1B (2 chunks per rank) runs and prints its prediction;
# - kill -9 of stage 1 mid-run, and rank 1 exiting at step 3 (MOD_FAULT_EXIT_RANK): the job
#   fails, stage 0 naming the lost rank.
# Each rank writes its pid (a shell that execs modtrain) so one stage can be signalled alone.
# Usage: pipeline_stop_cli_test.sh MODTRAIN SOURCE_DIR MPIEXEC
set -euo pipefail
modtrain=$1
src=$2
mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "pipeline_stop_cli_test: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo  # loopback only
export MOD_COLLECTIVE_TIMEOUT_S=30  # a stage left waiting aborts well before the CTest timeout

cat "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null
steps=150
small=(--config "$src/configs/recipes/tiny_dense.textproto" --data "$work/data"
  --set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128 --set model.n_layers=2
  --set model.seq_len=32 --set train.batch_size=4 --set train.grad_accum=4
  --set train.steps=$steps --set train.eval_every=0 --set optimizer.warmup_steps=5
  --set parallel.pp=2)
losses() { cut -d, -f1,2 "$1/metrics.csv"; }

# pp 2 in the background; each rank's pid goes to RUN_DIR.pid.RANK.
launch() {  # launch RUN_DIR LOG [modtrain train args...]
  local run=$1 log=$2; shift 2
  "$mpiexec" -n 2 --oversubscribe bash -c 'echo $$ > "$0.pid.$OMPI_COMM_WORLD_RANK"; exec "$@"' \
    "$run" "$modtrain" train "${small[@]}" --run-dir "$run" "$@" > "$log" 2>&1 &
  job=$!
}
# Waits until RUN_DIR's metrics.csv has more than ROWS lines and both pids are known.
wait_rows() {  # wait_rows RUN_DIR ROWS
  for _ in $(seq 1 400); do
    [ -f "$1.pid.1" ] && [ -f "$1/metrics.csv" ] && [ "$(wc -l < "$1/metrics.csv")" -gt "$2" ] && return
    sleep 0.05
  done
  fail "$1: no progress: $(cat "$1.log" 2> /dev/null)"
}
finish() { set +e; wait "$job"; rc=$?; set -e; }

# Uninterrupted, with the bubble in the summary.
launch "$work/whole" "$work/whole.log"
finish
[ "$rc" -eq 0 ] || fail "pp 2 run failed ($rc): $(cat "$work/whole.log")"
line=$(grep "^pipeline bubble: measured" "$work/whole.log") || fail "no measured bubble: $(cat "$work/whole.log")"
measured=$(sed -E 's/^pipeline bubble: measured ([0-9.]+) .*/\1/' <<< "$line")
# Inside (0, 1): every stage computes, and waits at least on a receive.
for b in $measured $(grep -Eo "stage [01] [0-9.]+" <<< "$line" | cut -d' ' -f3); do
  awk -v b="$b" 'BEGIN { exit !(b > 0 && b < 1) }' || fail "bubble $b not inside (0, 1): $line"
done
grep -Eq "stage 0 [0-9.]+, stage 1 [0-9.]+\), predicted \(pp-1\)/\(v m\+pp-1\) = 0\.2000 " <<< "$line" \
  || fail "bubble line lacks the stages or the prediction 1/5: $line"
# metrics.csv: the step's bubble in column pp_bubble, inside (0, 1) on every row.
awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) if ($i == "pp_bubble") c = i; if (!c) exit 1; next }
         !($c > 0 && $c < 1) { exit 1 }' "$work/whole/metrics.csv" \
  || fail "metrics.csv lacks pp_bubble inside (0, 1): $(head -3 "$work/whole/metrics.csv")"

# Interleaved 1F1B, 2 chunks of one block per rank: it runs, predicting (pp-1)/(v m+pp-1) = 1/9.
launch "$work/interleaved" "$work/interleaved.log" --set model.n_layers=4 --set train.steps=20 \
  --set parallel.pp_schedule=INTERLEAVED_1F1B --set parallel.virtual_stages=2
finish
[ "$rc" -eq 0 ] || fail "interleaved pp 2 run failed ($rc): $(cat "$work/interleaved.log")"
grep -Eq "^pipeline bubble: measured 0\.[0-9]+ .*= 0\.1111 for equal stages \(interleaved-1f1b, pp 2, v 2, m 4\)" \
  "$work/interleaved.log" || fail "interleaved: no bubble line predicting 1/9: $(cat "$work/interleaved.log")"

# SIGTERM to stage 1 only, mid-run.
launch "$work/cut" "$work/cut.log"
wait_rows "$work/cut" 10
kill -TERM "$(cat "$work/cut.pid.1")"
finish
[ "$rc" -eq 75 ] || fail "SIGTERM to stage 1: exit $rc, expected 75: $(cat "$work/cut.log")"
grep -q "stopping after step" "$work/cut.log" || fail "stage 0 printed no stop: $(cat "$work/cut.log")"
grep -q "^pipeline bubble: measured" "$work/cut.log" || fail "no bubble after a stop"
at=$(cat "$work/cut/checkpoints/latest")
[ "$at" != "step_00000150" ] || fail "the run finished before the signal arrived; nothing tested"
rows=$(($(wc -l < "$work/cut/metrics.csv") - 1))
[ "step_$(printf %08d "$rows")" = "$at" ] || fail "metrics.csv has $rows steps, the checkpoint is $at"
launch "$work/cut" "$work/resume.log" --resume auto
finish
[ "$rc" -eq 0 ] || fail "resume under pp 2 failed ($rc): $(cat "$work/resume.log")"
grep -q "resumed from .*$at: step [0-9]*, saved under dp 1 x tp 1 x pp 2" "$work/resume.log" \
  || fail "did not resume from $at saved under pp 2: $(cat "$work/resume.log")"
cmp -s <(losses "$work/whole") <(losses "$work/cut") \
  || fail "losses differ after resume: $(diff <(losses "$work/whole") <(losses "$work/cut") | head)"
cmp -s "$work/whole/model.safetensors" "$work/cut/model.safetensors" || fail "final weights differ after resume"

# kill -9 of stage 1: the job fails and stage 0 names rank 1.
launch "$work/dead" "$work/dead.log"
wait_rows "$work/dead" 3
kill -KILL "$(cat "$work/dead.pid.1")"
finish
[ "$rc" -ne 0 ] || fail "the job succeeded although stage 1 was killed"
grep -q "lost peer rank 1" "$work/dead.log" || fail "stage 0 did not name rank 1: $(cat "$work/dead.log")"
# A rank made to exit mid-run (MOD_FAULT_EXIT_RANK, the dead-rank hook every layout honours):
# the job fails, the dying rank says so and stage 0 names it.
MOD_TEST_HOOKS=1 MOD_FAULT_EXIT_RANK=1 MOD_FAULT_EXIT_STEP=3 \
  launch "$work/fault" "$work/fault.log"
finish
[ "$rc" -ne 0 ] || fail "the job succeeded although rank 1 exited"
grep -q "rank 1: exiting mid-step 3" "$work/fault.log" || fail "no message from the dying rank: $(cat "$work/fault.log")"
grep -q "lost peer rank 1" "$work/fault.log" || fail "stage 0 did not name rank 1: $(cat "$work/fault.log")"
echo "pipeline_stop_cli_test: all checks passed (stopped at $at, measured bubble $measured)"
