#!/usr/bin/env bash
# The pipeline settings on the command line: `flops` and `memory` print the stage partition and
# the bubble, a bad parallel.pp_layout names the field, and `train` refuses, before it reads any
# data, dp x tp x pp other than the number of processes and pp with what the pipeline trainer
# does not run (tests/parallel/pipeline_train_test.cpp trains under mpirun).
# Usage: pipeline_cli_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
recipe=$2/configs/recipes/tiny_mod.textproto
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "pipeline_cli_test: $*" >&2; exit 1; }

"$modtrain" flops --config "$recipe" --set parallel.pp=2 --set train.grad_accum=8 > "$work/flops.log"
grep -q "^partition: balanced by predicted forward+backward FLOPs" "$work/flops.log" \
  || fail "flops printed no partition: $(cat "$work/flops.log")"
grep -q "(pp-1)/(v m+pp-1) = 0.1111 for equal stages" "$work/flops.log" \
  || fail "flops printed no bubble (1/9 at pp 2, m 8): $(cat "$work/flops.log")"
"$modtrain" memory --config "$recipe" --set parallel.pp=2 --set parallel.pp_layout=[5,1] \
  > "$work/memory.log"
grep -q "^partition: by hand (parallel.pp_layout)" "$work/memory.log" \
  || fail "memory printed no partition: $(cat "$work/memory.log")"
grep -Eq "^ +1 +1 +5 " "$work/memory.log" || fail "memory: stage 1 is not block 5: $(cat "$work/memory.log")"

expect_error() {  # expect_error PATTERN command...
  local pattern=$1; shift
  if "$@" > "$work/out.log" 2> "$work/err.log"; then fail "succeeded: $*"; fi
  grep -q -- "$pattern" "$work/err.log" || fail "error for '$*' lacks '$pattern': $(cat "$work/err.log")"
}
expect_error "parallel.pp_layout: sums to 5 blocks, expected model.n_layers 6" \
  "$modtrain" flops --config "$recipe" --set parallel.pp=2 --set parallel.pp_layout=[3,2]
expect_error "parallel layout: dp (1) x tp (1) x pp (2) = 2 does not equal the world size 1" \
  "$modtrain" train --config "$recipe" --set parallel.pp=2 --run-dir "$work/run" --data "$work/none"
expect_error "parallel.pp: 2 does not combine with parallel.zero_stage 3" \
  "$modtrain" train --config "$recipe" --set parallel.pp=2 --set parallel.zero_stage=3 \
  --run-dir "$work/run" --data "$work/none"
echo "pipeline_cli_test: ok"
