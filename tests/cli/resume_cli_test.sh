#!/usr/bin/env bash
# Checkpoint, stop and resume through the command line: SIGTERM mid-run (and SIGUSR1 to mpirun
# with 2 ranks; SIGTERM to one of 4 ranks under ZeRO-3 with tp 2 and sequence parallelism) makes
# the trainer checkpoint and exit 75; `--resume auto` continues, and the
# final weights and per-step losses equal an uninterrupted run's bit for bit; export writes a
# safetensors file that eval reads and --init-from starts from.
# Usage: resume_cli_test.sh MODTRAIN SOURCE_DIR [MPIEXEC]
set -euo pipefail
modtrain=$1
src=$2
mpiexec=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "resume_cli_test: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo  # loopback only

cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null
steps=400
small=(--config "$src/configs/recipes/tiny_mod.textproto" --data "$work/data"
  --set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128 --set model.n_layers=2
  --set model.seq_len=64 --set train.steps=$steps --set train.eval_every=100
  --set optimizer.warmup_steps=5 --set checkpoint.every_steps=100)
losses() { cut -d, -f1,2 "$1/metrics.csv"; }

"$modtrain" train "${small[@]}" --run-dir "$work/whole" > /dev/null

# Signals `pid` once metrics.csv of `run` has more than 20 rows, waits for it, sets rc.
stop_midway() {  # stop_midway RUN_DIR SIGNAL PID
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.csv" ] && [ "$(wc -l < "$1/metrics.csv")" -gt 20 ] && break
    sleep 0.05
  done
  kill -"$2" "$3"
  set +e; wait "$3"; rc=$?; set -e
}

# One process, SIGTERM.
"$modtrain" train "${small[@]}" --run-dir "$work/cut" > "$work/cut.log" 2>&1 &
stop_midway "$work/cut" TERM $!
[ "$rc" -eq 75 ] || fail "SIGTERM: exit $rc, expected 75: $(cat "$work/cut.log")"
grep -q "stopping after step" "$work/cut.log" || fail "no stop message"
at=$(cat "$work/cut/checkpoints/latest")
[ "$at" != "step_00000400" ] || fail "the run finished before the signal arrived; nothing tested"
"$modtrain" train "${small[@]}" --run-dir "$work/cut" --resume auto > "$work/resume.log"
grep -q "resumed from .*$at" "$work/resume.log" || fail "did not resume from $at: $(cat "$work/resume.log")"
cmp -s <(losses "$work/whole") <(losses "$work/cut") || fail "losses differ after resume: $(diff <(losses "$work/whole") <(losses "$work/cut") | head)"
cmp -s "$work/whole/model.safetensors" "$work/cut/model.safetensors" || fail "final weights differ after resume"

# kill -9 while a checkpoint is written (fault injection at each point of the save): `latest`
# still names the previous checkpoint, and resuming from it ends where the whole run ended.
for point in after_shard after_metadata after_rename; do
  run="$work/crash_$point"
  mkdir -p "$run/checkpoints"
  cp -r "$work/whole/checkpoints/step_00000200" "$run/checkpoints/"
  echo step_00000200 > "$run/checkpoints/latest"
  set +e
  MOD_TEST_HOOKS=1 MOD_CHECKPOINT_FAULT=$point "$modtrain" train "${small[@]}" --run-dir "$run" --resume auto > /dev/null 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 137 ] || fail "$point: expected death by SIGKILL (137), got $rc"
  [ "$(cat "$run/checkpoints/latest")" = "step_00000200" ] || fail "$point: latest moved to $(cat "$run/checkpoints/latest")"
  "$modtrain" train "${small[@]}" --run-dir "$run" --resume auto > /dev/null
  cmp -s "$work/whole/model.safetensors" "$run/model.safetensors" || fail "$point: weights differ after crash + resume"
done

# The fault hook without the test switch (MOD_TEST_HOOKS=1): ignored, and the run says so.
MOD_CHECKPOINT_FAULT=after_shard "$modtrain" train "${small[@]}" --set train.steps=4 \
  --set checkpoint.every_steps=2 --run-dir "$work/no_switch" > "$work/no_switch.log" 2>&1 \
  || fail "MOD_CHECKPOINT_FAULT without MOD_TEST_HOOKS=1 still acted: $(cat "$work/no_switch.log")"
grep -q "ignoring MOD_CHECKPOINT_FAULT: test hooks are read only under MOD_TEST_HOOKS=1" \
  "$work/no_switch.log" || fail "no note that MOD_CHECKPOINT_FAULT was ignored"
[ "$(cat "$work/no_switch/checkpoints/latest")" = "step_00000004" ] || fail "no_switch: not checkpointed"

# Export, eval and init-from.
"$modtrain" export --checkpoint "$work/cut" --format safetensors --out "$work/export.safetensors" > /dev/null
"$modtrain" eval --checkpoint "$work/export.safetensors" --data "$work/data" --batches 2 | grep -q "top-C" \
  || fail "eval cannot read the export"
"$modtrain" train "${small[@]}" --set train.steps=5 --set checkpoint.every_steps=0 \
  --run-dir "$work/init" --init-from "$work/export.safetensors" > /dev/null
# Its first loss is near the exported run's last one (the corpus is this repository's sources,
# so absolute losses move as they grow), and far below an untrained model's ln 256 = 5.55.
first=$(awk -F, 'NR==2 {print $2}' "$work/init/metrics.csv")
exported=$(awk -F, 'END {print $2}' "$work/cut/metrics.csv")
awk -v a="$first" -v e="$exported" 'BEGIN { exit !(a < e + 0.5 && a < 4.5) }' ||
  fail "--init-from did not start from the trained weights (loss $first, exported run's last $exported)"

# Two ranks under mpirun (tp=2): SIGUSR1 to mpirun reaches both, both checkpoint, exit 75;
# the resume under dp=2 finishes.
if [ -n "$mpiexec" ]; then
  "$mpiexec" -n 2 --oversubscribe "$modtrain" train "${small[@]}" --set parallel.tp=2 \
    --run-dir "$work/mpi" > "$work/mpi.log" 2>&1 &
  stop_midway "$work/mpi" USR1 $!
  [ "$rc" -eq 75 ] || fail "mpirun + SIGUSR1: exit $rc, expected 75: $(cat "$work/mpi.log")"
  "$mpiexec" -n 2 --oversubscribe "$modtrain" train "${small[@]}" --set parallel.dp=2 \
    --run-dir "$work/mpi" --resume auto > "$work/mpi_resume.log" 2>&1 \
    || fail "resume under dp=2 failed: $(cat "$work/mpi_resume.log")"
  [ "$(cat "$work/mpi/checkpoints/latest")" = "step_00000400" ] || fail "the resumed mpi run did not finish"

  # Four ranks, ZeRO-3 with tp 2 and sequence parallelism (dp=2 tp=2: stage 3 shards each tp
  # shard over the dp pair; one run covers both, as they compose): SIGTERM to one rank mid-step
  # (as a node's preemption notice): every rank stops after that step with the units gathered
  # into a complete checkpoint (exit 75), the earlier periodic one untouched, no .tmp left; the
  # resume at the same layout ends bit for bit where an uninterrupted run ends.
  z3=("${small[@]}" --set train.steps=24 --set checkpoint.every_steps=8 --set parallel.dp=2
    --set parallel.tp=2 --set parallel.zero_stage=3 --set parallel.sequence_parallel=true)
  "$mpiexec" -n 4 --oversubscribe "$modtrain" train "${z3[@]}" --run-dir "$work/z3_whole" \
    > "$work/z3_whole.log" 2>&1 || fail "ZeRO-3 + SP run failed: $(cat "$work/z3_whole.log")"
  "$mpiexec" -n 4 --oversubscribe "$modtrain" train "${z3[@]}" --run-dir "$work/z3_cut" \
    > "$work/z3_cut.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 1200); do  # past step 10: the step-8 checkpoint committed
    [ -f "$work/z3_cut/metrics.csv" ] && [ "$(wc -l < "$work/z3_cut/metrics.csv")" -gt 10 ] && break
    sleep 0.05
  done
  rank_pid=$(pgrep -P "$launcher" | tail -n 1)  # one rank (mpirun forks them locally)
  [ -n "$rank_pid" ] || fail "no rank process under mpirun $launcher"
  kill -TERM "$rank_pid"
  set +e; wait "$launcher"; rc=$?; set -e
  [ "$rc" -eq 75 ] || fail "ZeRO-3 + SP, SIGTERM to one rank: exit $rc, expected 75: $(cat "$work/z3_cut.log")"
  z3_at=$(cat "$work/z3_cut/checkpoints/latest")
  [ "$z3_at" != "step_00000024" ] || fail "ZeRO-3 + SP: the run finished before the signal; nothing tested"
  [ -f "$work/z3_cut/checkpoints/step_00000008/metadata.pb" ] || fail "ZeRO-3 + SP: step 8's checkpoint is gone"
  ! ls "$work/z3_cut/checkpoints" | grep -q '\.tmp$' || fail "ZeRO-3 + SP: a .tmp left: $(ls "$work/z3_cut/checkpoints")"
  "$mpiexec" -n 4 --oversubscribe "$modtrain" train "${z3[@]}" --run-dir "$work/z3_cut" --resume auto \
    > "$work/z3_resume.log" 2>&1 || fail "ZeRO-3 + SP resume failed: $(cat "$work/z3_resume.log")"
  grep -q "resumed from .*$z3_at" "$work/z3_resume.log" || fail "ZeRO-3 + SP: did not resume from $z3_at"
  cmp -s <(losses "$work/z3_whole") <(losses "$work/z3_cut") ||
    fail "ZeRO-3 + SP: losses differ after resume: $(diff <(losses "$work/z3_whole") <(losses "$work/z3_cut") | head)"
  cmp -s "$work/z3_whole/model.safetensors" "$work/z3_cut/model.safetensors" ||
    fail "ZeRO-3 + SP: final weights differ after resume"
fi
echo "resume_cli_test: all checks passed (stopped at $at)"
