#!/usr/bin/env bash
# isoFLOP grids through the command line, on tests/grid/tiny_grid.textproto (8 points of a few
# seconds) and a small corpus: plan writes plan.csv and the point configs; run is stopped by
# SIGTERM mid-point (exit 75), run again resumes that point from its checkpoint and finishes
# every point; a third run skips them all at once; collect writes results.csv with every point
# and both PNGs (checked by their magic bytes; that check alone is skipped, saying so, without
# gnuplot), and without gnuplot still writes results.csv and says why it drew nothing; submit
# --dry-run writes the job array; one of its tasks, run by hand with a stand-in srun, trains a
# point and another skips a finished one. Usage: grid_cli_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "grid_cli_test: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1
spec=$src/tests/grid/tiny_grid.textproto
out=$work/grid
opts=(--spec "$spec" --out "$out" --data "$work/data")
t0=$(date +%s)

cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --val-fraction 0.1 > /dev/null

# plan: the table, plan.csv (a header and 8 points) and one RunConfig per point.
"$modtrain" grid plan "${opts[@]}" --tokens-per-second 50000 > "$work/plan.log"
grep -q "b4e10_s2_mod" "$work/plan.log" || fail "plan did not list the points: $(cat "$work/plan.log")"
[ "$(wc -l < "$out/plan.csv")" -eq 9 ] || fail "plan.csv: expected 9 lines: $(cat "$out/plan.csv")"
[ "$(ls "$out/points/"*.textproto | wc -l)" -eq 8 ] || fail "expected 8 point configs"
head -1 "$out/plan.csv" | grep -q predicted_peak_bytes || fail "plan.csv: no predicted peak column"
"$modtrain" grid plan "${opts[@]}" --device-memory-gb 0.001 | grep -q "^warning: 8 points" \
  || fail "plan --device-memory-gb 0.001 did not warn about every point"
steps=$(grep -E '^  steps: ' "$out/points/b2e10_s1_dense.textproto" | awk '{print $2}')
[ "$steps" -gt 100 ] || fail "b2e10_s1_dense: train.steps '$steps'"

# run, stopped by SIGTERM once the first point is past its first checkpoint (step 100).
first=$out/runs/b2e10_s1_dense
"$modtrain" grid run "${opts[@]}" > "$work/run1.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$first/metrics.csv" ] && [ "$(wc -l < "$first/metrics.csv")" -gt 130 ] && break
  sleep 0.05
done
kill -TERM "$pid"
set +e; wait "$pid"; rc=$?; set -e
[ "$rc" -eq 75 ] || fail "grid run after SIGTERM: exit $rc, expected 75: $(cat "$work/run1.log")"
grep -q "stopped" "$work/run1.log" || fail "grid run did not report the stop: $(cat "$work/run1.log")"
[ ! -f "$first/model.safetensors" ] || fail "the first point finished before the signal; nothing tested"
at=$(cat "$first/checkpoints/latest")

# run again: the stopped point resumes from its checkpoint, every point finishes.
"$modtrain" grid run "${opts[@]}" > "$work/run2.log" 2>&1 || fail "second grid run failed: $(cat "$work/run2.log")"
grep -q "b2e10_s1_dense: .*resuming after step" "$work/run2.log" || fail "no resume: $(cat "$work/run2.log")"
grep -q "resumed from .*$at" "$out/logs/b2e10_s1_dense.log" || fail "the trainer did not resume from $at"
for p in "$out"/points/*.textproto; do
  name=$(basename "$p" .textproto)
  [ -f "$out/runs/$name/model.safetensors" ] || fail "$name has no model.safetensors"
done

# a third run skips every point, quickly.
s=$(date +%s.%N)
"$modtrain" grid run "${opts[@]}" > "$work/run3.log"
e=$(date +%s.%N)
[ "$(grep -c "finished already, skipped" "$work/run3.log")" -eq 8 ] || fail "third run: $(cat "$work/run3.log")"
awk -v s="$s" -v e="$e" 'BEGIN { exit !(e - s < 5) }' || fail "skipping 8 finished points took $(awk -v s="$s" -v e="$e" 'BEGIN{print e-s}') s"

# collect without gnuplot: results.csv, and a reason for each missing PNG.
PATH=/nonexistent "$modtrain" grid collect "${opts[@]}" > "$work/collect0.log"
grep -q "not drawn: isoflop.png: gnuplot is not on PATH" "$work/collect0.log" \
  || fail "collect without gnuplot: $(cat "$work/collect0.log")"
[ -f "$out/results.csv" ] || fail "collect without gnuplot wrote no results.csv"

# collect: every point finished with a loss; both PNGs when gnuplot is there.
"$modtrain" grid collect "${opts[@]}" > "$work/collect.log"
[ "$(wc -l < "$out/results.csv")" -eq 9 ] || fail "results.csv: expected 9 lines: $(cat "$out/results.csv")"
finished=$(awk -F, 'NR > 1 && $16 == "finished" && $14 > 0 && $14 < 10' "$out/results.csv" | wc -l)
[ "$finished" -eq 8 ] || fail "results.csv: $finished of 8 points finished with a loss: $(cat "$out/results.csv")"
# MoD points also carry the causal-routing loss (what sampling gets); dense points have none.
causal=$(awk -F, 'NR > 1 && (($6 == 1 && $15 > 0 && $15 < 10) || ($6 == 0 && $15 == ""))' "$out/results.csv" | wc -l)
[ "$causal" -eq 8 ] || fail "results.csv: causal losses of MoD points only: $(cat "$out/results.csv")"
png_note="PNGs checked"
if command -v gnuplot > /dev/null; then
  for png in isoflop loss_vs_flops_per_token; do
    [ "$(head -c 8 "$out/$png.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] \
      || fail "$png.png is not a PNG: $(cat "$work/collect.log")"
  done
else
  png_note="PNG check SKIPPED: gnuplot is not installed (Debian package gnuplot-nox)"
  echo "grid_cli_test: $png_note"
fi

# submit --dry-run: the job-array script.
"$modtrain" grid submit "${opts[@]}" --dry-run > "$work/submit.log"
sb=$out/grid.sbatch
for line in "#SBATCH --array=0-7%2" "#SBATCH --requeue" "#SBATCH --signal=USR1@60" \
    "#SBATCH --output=$out/logs/task_%a.out" "--resume auto"; do
  grep -qF -- "$line" "$sb" || fail "grid.sbatch lacks '$line'"
done
bash -n "$sb" || fail "grid.sbatch is not valid bash"
# The requeue protocol: grid.sbatch sources the copy of cluster/modtrain_job.sh beside it.
cmp -s "$out/modtrain_job.sh" "$src/cluster/modtrain_job.sh" \
  || fail "$out/modtrain_job.sh is not a copy of cluster/modtrain_job.sh"
grep -qF 'source "$out/modtrain_job.sh"' "$sb" || fail "grid.sbatch does not source modtrain_job.sh"
# submit without --dry-run and without sbatch on PATH: a clear error.
if PATH=/nonexistent "$modtrain" grid submit "${opts[@]}" > /dev/null 2> "$work/submit.err"; then
  fail "submit succeeded without sbatch"
fi
grep -q "sbatch is not on PATH" "$work/submit.err" || fail "submit without sbatch: $(cat "$work/submit.err")"

# Array tasks run by hand (srun stands in as a plain exec): a finished point exits at once; a
# point whose run directory is gone trains again to the end.
mkdir -p "$work/bin"
printf '#!/bin/sh\nexec "$@"\n' > "$work/bin/srun"
chmod +x "$work/bin/srun"
SLURM_ARRAY_TASK_ID=0 PATH="$work/bin:$PATH" bash "$sb" > "$work/task0.log" 2>&1 || fail "task 0: $(cat "$work/task0.log")"
grep -q "is finished" "$work/task0.log" || fail "task 0 did not skip its finished point: $(cat "$work/task0.log")"
rm -rf "$out/runs/b2e10_s2_dense"
SLURM_ARRAY_TASK_ID=2 PATH="$work/bin:$PATH" bash "$sb" > "$work/task2.log" 2>&1 || fail "task 2: $(cat "$work/task2.log")"
[ -f "$out/runs/b2e10_s2_dense/model.safetensors" ] || fail "task 2 did not train b2e10_s2_dense: $(cat "$work/task2.log")"
grep -q "modtrain_job: .*the training step exited with status 0" "$work/task2.log" \
  || fail "task 2 did not run its step through mod_run_step: $(cat "$work/task2.log")"

echo "grid_cli_test: all checks passed in $(( $(date +%s) - t0 )) s (stopped at $at; $png_note)"
