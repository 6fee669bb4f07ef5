#!/usr/bin/env bash
# configs/grids/gpu_one.textproto on the CPU (docs/grids.md, "gpu_one"): `grid plan` at a stated
# FLOP rate gives the expected table (points, seeds, steps, times, the skipped point, and the
# points that would reread a small corpus); then a slice of the same spec shrunk to a CPU budget
# (two budgets, the smallest shape, 128-token steps, no CUDA) runs three points -- d128 dense
# with both seeds and d128 MoD -- and collect ranks by the mean over seeds and shows the spread.
# Usage: gpu_one_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "gpu_one_test: $*" >&2; exit 1; }
export OMP_NUM_THREADS=1
spec=$src/configs/grids/gpu_one.textproto

# A small corpus with the grid's tokenizer (vocab 16384, as base.model.vocab_size).
cat "$src"/core/*.cpp "$src"/core/*.h "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --tokenizer "$src/configs/corpora/linux_bpe16k.json" \
  --out "$work/data" --val-fraction 0.1 --threads 2 > "$work/prep.log" 2>&1 \
  || fail "prep: $(cat "$work/prep.log")"

# plan at 1.5e14 FLOP/s against 80 GB: 3 budgets x 6 shapes x 2 variants + 12 second seeds.
out=$work/plan
"$modtrain" grid plan --spec "$spec" --out "$out" --data "$work/data" --flops-per-second 1.5e14 \
  --device-memory-gb 80 > "$work/plan.log" || fail "plan: $(cat "$work/plan.log")"
grep -q "3 budgets x 6 shapes x 2 variants = 48 points, 45 runnable" "$work/plan.log" \
  || fail "plan header: $(head -3 "$work/plan.log")"
[ "$(wc -l < "$out/plan.csv")" -eq 49 ] || fail "plan.csv: expected 49 lines"
cell() {  # cell POINT COLUMN: plan.csv's value
  awk -F, -v p="$1" -v c="$2" 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i }
    NR > 1 && $1 == p { print $col[c] }' "$out/plan.csv"
}
check() {  # check POINT COLUMN EXPECTED
  local v
  v=$(cell "$1" "$2")
  [ "$v" = "$3" ] || fail "plan.csv $1 $2: '$v', expected '$3'"
}
# The smallest shape: 2.88M parameters; at 1e15 its steps are budget / (32768 x FLOPs per token).
check b1e15_d128_dense parameters 2884736
check b1e15_d128_dense tokens_per_step 32768
check b1e15_d128_dense status runnable
steps=$(cell b1e15_d128_dense steps)
tpt=$(cell b1e15_d128_dense training_flops_per_token)
awk -v s="$steps" -v f="$tpt" 'BEGIN { exit !(s == int(1e15 / (32768 * f))) }' \
  || fail "b1e15_d128_dense: $steps steps at $tpt FLOPs/token"
# MoD buys more steps than dense; the time is FLOPs / rate.
[ "$(cell b1e15_d128_mod steps)" -gt "$steps" ] || fail "MoD d128 does not train more steps"
awk -v e="$(cell b3e15_d512_dense est_seconds)" -v f="$(cell b3e15_d512_dense flops)" \
  'BEGIN { exit !(e > 0 && (e - f / 1.5e14) ^ 2 < 1e-6) }' || fail "est_seconds is not FLOPs / 1.5e14"
# The second seed at 3e15 only, right after the first; the two largest dense and the largest MoD at 1e15 buy too few steps.
check b3e15_d256_mod_s2 status runnable
check b3e15_d256_mod_s2 steps "$(cell b3e15_d256_mod steps)"
[ "$(cell b3e15_d256_mod_s2 array_index)" -eq $(($(cell b3e15_d256_mod array_index) + 1)) ] \
  || fail "b3e15_d256_mod_s2 does not follow b3e15_d256_mod"
grep -q "seed: 2$" "$out/points/b3e15_d256_mod_s2.textproto" || fail "the second seed's config has no seed 2"
[ -z "$(cell b1e15_d128_dense_s2 status)" ] && [ -z "$(cell b1e16_d128_dense_s2 status)" ] \
  || fail "second seeds outside 3e15"
check b1e15_d768_dense status skipped
check b1e15_d768_mod status skipped
check b1e15_d640_dense status skipped
check b1e15_d640_mod status runnable
grep -q "b1e15_d768_dense: the budget buys .* fewer than min_steps 100" "$work/plan.log" \
  || fail "the skipped point's reason: $(cat "$work/plan.log")"
# Every point but none fits 80 GB; on this small corpus every point rereads its data.
! grep -q "predicted peak exceeds" "$work/plan.log" || fail "a point over 80 GB: $(cat "$work/plan.log")"
grep -q "^warning: 45 points train on more tokens than the .* training tokens of $work/data" \
  "$work/plan.log" || fail "no reread warning: $(grep warning "$work/plan.log")"
grep -q "b1e16_d128_dense rereads" "$work/plan.log" || fail "b1e16_d128_dense not named"
awk -v e="$(cell b1e16_d128_dense data_epochs)" 'BEGIN { exit !(e > 100) }' \
  || fail "data_epochs of b1e16_d128_dense: $(cell b1e16_d128_dense data_epochs)"
grep -q "^total: .* in 45 runs, about .* one after another (time: 1.5e+14 FLOP/s)" \
  "$work/plan.log" || fail "plan total: $(tail -3 "$work/plan.log")"

# The same spec at a CPU's scale: every edit must apply.
small=$work/gpu_one_cpu.textproto
sed -e 's/^budgets: \[1e15, 3e15, 1e16\]/budgets: [1e11, 3e11]/' \
    -e 's/^seed_budgets: \[3e15\]/seed_budgets: [1e11]/' \
    -e 's/^min_steps: 100/min_steps: 10/' \
    -e 's/seq_len: 512/seq_len: 64/' \
    -e 's/batch_size: 64 /batch_size: 2 /' \
    -e 's/eval_every: 1000 eval_batches: 20/eval_every: 20 eval_batches: 2/' \
    -e 's/device: CUDA precision: BF16 cuda_graph: true//' "$spec" > "$small"
for gone in "1e16" "3e15" "min_steps: 100" "seq_len: 512" "batch_size: 64" "CUDA"; do
  ! grep -v "^#" "$small" | grep -qF "$gone" || fail "the CPU slice still has '$gone'"
done
opts=(--spec "$small" --out "$work/grid" --data "$work/data")
points=(b1e11_d128_dense b1e11_d128_dense_s2 b1e11_d128_mod)
"$modtrain" grid run "${opts[@]}" "${points[@]/#/--point=}" > "$work/run.log" 2>&1 \
  || fail "grid run: $(cat "$work/run.log")"
"$modtrain" grid collect "${opts[@]}" > "$work/collect.log" || fail "collect: $(cat "$work/collect.log")"
r=$work/grid/results.csv
head -1 "$r" | grep -q "^point,budget,shape,variant,seed,routed," || fail "results.csv header: $(head -1 "$r")"
for p in "${points[@]}"; do
  awk -F, -v p="$p" 'NR > 1 && $1 == p && $16 == "finished" && $14 > 0 && $14 < 20 { ok = 1 }
    END { exit !ok }' "$r" || fail "$p has no final loss: $(cat "$r")"
done
awk -F, 'NR > 1 && $1 == "b1e11_d128_dense_s2" && $5 == 2 { ok = 1 } END { exit !ok }' "$r" \
  || fail "results.csv: no seed 2 for b1e11_d128_dense_s2"
grep -q "^  b1e11_d128_dense: [0-9.]* (2 seeds, [0-9.]* .. [0-9.]*, spread [0-9.]*)" \
  "$work/collect.log" || fail "no seed spread: $(cat "$work/collect.log")"
grep -q "1e11 FLOPs, mod .* causal" "$work/collect.log" || fail "no causal best: $(cat "$work/collect.log")"
echo "gpu_one_test: ok"
