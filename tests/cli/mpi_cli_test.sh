#!/usr/bin/env bash
# `mpirun -np 2 modtrain train` end to end: a dp=2 run and a tp=2 run learn and write one set of
# files (rank 0); a layout that does not fit the world, the model or the batch fails on every
# rank with the equation; a rank that dies mid-step ends the job with a clear message within
# 60 s. Usage: mpi_cli_test.sh MODTRAIN SOURCE_DIR MPIEXEC
set -euo pipefail
modtrain=$1
src=$2
mpiexec=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "mpi_cli_test: $*" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo  # loopback only
mpirun2() { "$mpiexec" -n 2 --oversubscribe "$@"; }

cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null
small=(--config "$src/configs/recipes/tiny_mod.textproto" --data "$work/data"
  --set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128 --set model.n_layers=2
  --set model.seq_len=64 --set train.steps=20 --set train.eval_every=10
  --set optimizer.warmup_steps=5 --set optimizer.lr=3e-3)

for layout in "dp=2" "tp=2"; do
  run="$work/run_${layout%%=*}"
  mpirun2 "$modtrain" train "${small[@]}" --run-dir "$run" --set "parallel.$layout" \
    --rank-logs "$run/logs" > "$work/train.log"
  grep -q "dp $([ "$layout" = dp=2 ] && echo 2 || echo 1) x tp" "$work/train.log" \
    || fail "$layout: no layout line in rank 0's output"
  [ "$(grep -c '^step ' "$work/train.log")" -ge 1 ] || fail "$layout: no progress from rank 0"
  grep -q "^step" "$run/logs/rank_1.log" || fail "$layout: rank 1 wrote no log with --rank-logs"
  rows=$(($(wc -l < "$run/metrics.csv") - 1))
  [ "$rows" -eq 20 ] || fail "$layout: metrics.csv has $rows rows, expected 20 (one writer)"
  first=$(awk -F, 'NR==2 {print $2}' "$run/metrics.csv")
  last=$(awk -F, 'END {print $2}' "$run/metrics.csv")
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }' || fail "$layout: loss $first -> $last"
  "$modtrain" eval --checkpoint "$run/model.safetensors" --data "$work/data" --batches 2 \
    | grep -q "top-C" || fail "$layout: weights written under $layout do not load in one process"
done

# Bad layouts: non-zero exit, the equation or the field, from every rank.
expect_error() {  # expect_error PATTERN args...
  local pattern=$1; shift
  if mpirun2 "$modtrain" train "${small[@]}" --run-dir "$work/bad" "$@" > "$work/out.log" 2>&1; then
    fail "succeeded: $*"
  fi
  grep -q -- "$pattern" "$work/out.log" || fail "error for '$*' lacks '$pattern': $(cat "$work/out.log")"
}
expect_error "dp (4) x tp (1) = 4 does not equal the world size 2" --set parallel.dp=4
expect_error "tp (2) must divide model.n_heads (3)" --set parallel.tp=2 --set model.n_heads=3 --set model.d_model=48
expect_error "train.batch_size: 3 must be divisible by parallel.dp 2" --set parallel.dp=2 --set train.batch_size=3

# A rank that exits mid-step: the job fails, says which rank, and does so within 60 s.
start=$(date +%s)
if MOD_TEST_HOOKS=1 MOD_FAULT_EXIT_RANK=1 MOD_FAULT_EXIT_STEP=3 \
    mpirun2 -x MOD_TEST_HOOKS -x MOD_FAULT_EXIT_RANK -x MOD_FAULT_EXIT_STEP \
    "$modtrain" train "${small[@]}" --run-dir "$work/dead" --set parallel.dp=2 > "$work/dead.log" 2>&1; then
  fail "the job succeeded although rank 1 exited"
fi
elapsed=$(($(date +%s) - start))
[ "$elapsed" -le 60 ] || fail "the job took ${elapsed}s to fail after a rank died"
grep -q "rank 1: exiting mid-step 3" "$work/dead.log" || fail "no message from the dying rank"
grep -qi "exited\|abort" "$work/dead.log" || fail "mpirun did not report the failure: $(cat "$work/dead.log")"
echo "mpi_cli_test: all checks passed (dead rank detected in ${elapsed}s)"
