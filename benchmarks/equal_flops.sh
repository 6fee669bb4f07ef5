#!/usr/bin/env bash
# equal_flops: recipes trained for the same training FLOPs on the KJV corpus, then evaluated
# side by side. The first recipe (the reference, tiny_dense by default) gets DENSE_STEPS steps;
# recipe x gets DENSE_STEPS * flops_ref * tokens_ref / (flops_x * tokens_x) steps, with per-token
# training FLOPs read from `modtrain flops` (active FLOPs: an MoE layer counts the experts on
# their slots only) and tokens per step = batch_size x seq_len of each recipe.
#
# Usage: benchmarks/equal_flops.sh [RECIPE ...]
#   RECIPE: a name in configs/recipes (tiny_moe) or a .textproto path. Default: tiny_dense
#   tiny_mod tiny_moe tiny_mode_staged tiny_mode_integrated. The first recipe is the reference.
#   benchmarks/equal_flops.sh tiny_dense tiny_mod     the original dense vs MoD comparison
# Environment: DENSE_STEPS the reference's steps (default 300, the recipes': ~3 minutes per
#   recipe on 2 idle cores), BUILD_DIR (default build; needs launcher/modtrain and
#   benchmarks/routing_eval), DATA (default data/kjv), RUN_ROOT (default runs/equal_flops),
#   EVAL_BATCHES validation batches (default 16, of 8 sequences), REUSE=1 keeps a recipe's
#   existing RUN_ROOT/<name>/model.safetensors instead of training it again and continues an
#   interrupted run from its latest checkpoint (its "train s" then counts this part only: "+").
#
# Validation loss is reported twice: with training-time routing (MoD top-C, MoE expert choice:
# both pick among the whole sequence, so they see the future) and with causal routing (each
# token decides from its own input, as in sampling). A dense model has one loss, in both columns.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
DENSE_STEPS=${DENSE_STEPS:-300}
DATA=${DATA:-data/kjv}
RUN_ROOT=${RUN_ROOT:-runs/equal_flops}
EVAL_BATCHES=${EVAL_BATCHES:-16}
REUSE=${REUSE:-0}
MODTRAIN="$BUILD_DIR/launcher/modtrain"
ROUTING_EVAL="$BUILD_DIR/benchmarks/routing_eval"

recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(tiny_dense tiny_mod tiny_moe tiny_mode_staged tiny_mode_integrated)

for tool in "$MODTRAIN" "$ROUTING_EVAL"; do
  [[ -x "$tool" ]] || { echo "equal_flops: $tool missing: build it (ninja -C $BUILD_DIR modtrain routing_eval)" >&2; exit 1; }
done
if [[ ! -f "$DATA/train.bin" ]]; then
  echo "== preparing $DATA (modtrain prep --kjv) =="
  "$MODTRAIN" prep --kjv --out "$DATA"
fi

recipe_path() { [[ "$1" == *.textproto ]] && echo "$1" || echo "configs/recipes/$1.textproto"; }
training_flops() {  # per-token training FLOPs of a recipe
  "$MODTRAIN" flops --config "$1" | sed -n 's/.*training \([0-9.e+-]*\) FLOPs\/token.*/\1/p'
}
field() { sed -n "s/^ *$1: *\([0-9]*\).*/\1/p" "$2" | head -1; }  # a recipe's integer field
tokens_per_step() { echo $(($(field batch_size "$1") * $(field seq_len "$1"))); }
budget() { awk -v s="$1" -v f="$2" -v t="$3" 'BEGIN { printf "%.4g", s * f * t }'; }

declare -A path flops tokens steps seconds
names=()
for r in "${recipes[@]}"; do
  p=$(recipe_path "$r")
  [[ -f "$p" ]] || { echo "equal_flops: no recipe $p" >&2; exit 1; }
  name=$(basename "$p" .textproto)
  names+=("$name")
  path[$name]=$p
  flops[$name]=$(training_flops "$p")
  [[ -n "${flops[$name]}" ]] || { echo "equal_flops: cannot read 'modtrain flops --config $p'" >&2; exit 1; }
  tokens[$name]=$(tokens_per_step "$p")
done
ref=${names[0]}
echo "== equal training FLOPs: $ref ${flops[$ref]} FLOPs/token x ${tokens[$ref]} tokens/step x $DENSE_STEPS steps =="
for name in "${names[@]}"; do
  steps[$name]=$(awk -v s="$DENSE_STEPS" -v d="${flops[$ref]}" -v m="${flops[$name]}" \
    -v td="${tokens[$ref]}" -v tm="${tokens[$name]}" 'BEGIN { printf "%d", s * d * td / (m * tm) + 0.5 }')
  echo "   $name: ${flops[$name]} FLOPs/token x ${tokens[$name]} x ${steps[$name]} steps = $(budget "${steps[$name]}" "${flops[$name]}" "${tokens[$name]}") FLOPs"
done

train() {  # name
  local name=$1 start=$SECONDS
  echo
  if [[ "$REUSE" == 1 && -f "$RUN_ROOT/$name/model.safetensors" ]]; then
    echo "== $name: reusing $RUN_ROOT/$name/model.safetensors (REUSE=1) =="
    seconds[$name]="-"
    return
  fi
  local resume=()
  # REUSE=1: an interrupted run (a checkpoint, no weights) continues from its latest checkpoint.
  [[ "$REUSE" == 1 ]] && resume=(--resume auto)
  echo "== train $name: ${steps[$name]} steps =="
  "$MODTRAIN" train --config "${path[$name]}" --run-dir "$RUN_ROOT/$name" --data "$DATA" \
    --set "train.steps=${steps[$name]}" --set train.log_every=50 --set train.eval_every=0 "${resume[@]}"
  seconds[$name]=$((SECONDS - start))
  [[ "$REUSE" == 1 && -d "$RUN_ROOT/$name/checkpoints" ]] && seconds[$name]="${seconds[$name]}+"
  echo "   $name trained in ${seconds[$name]} s"
}
for name in "${names[@]}"; do train "$name"; done

echo
weights=()
for name in "${names[@]}"; do weights+=("$RUN_ROOT/$name/model.safetensors"); done
evals=$("$ROUTING_EVAL" --data "$DATA" --batches "$EVAL_BATCHES" "${weights[@]}")
echo "$evals"

# Loss lines of one model's block in routing_eval's output ("name (step N) ..." then its lines).
loss_of() {  # name which ("top-C routing" | "causal routing")
  awk -v n="$1" -v w="$2" '$1 == n && $2 == "(step" { on = 1; next } /^[^ ]/ { on = 0 }
    on && index($0, w) { sub(/.*: */, ""); print; exit }' <<<"$evals"
}
delta() { [[ "$1" == "-" || "$2" == "-" ]] && echo "-" || awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.4f", a - b }'; }
ref_loss=$(loss_of "$ref" "top-C routing")
echo
echo "== validation loss at equal training FLOPs ($EVAL_BATCHES batches of 8 sequences from the validation split of $DATA; reference $ref) =="
printf "  %-22s %12s %6s %12s %8s %10s %9s %11s %9s\n" recipe "FLOPs/token" steps "train FLOPs" "train s" \
  "loss top-C" "vs ref" "loss causal" "vs ref"
for name in "${names[@]}"; do
  top=$(loss_of "$name" "top-C routing")
  causal=$(loss_of "$name" "causal routing")
  [[ -n "$causal" ]] || causal=$top  # dense: one routing
  [[ -n "$top" ]] || top="-"
  printf "  %-22s %12s %6s %12s %8s %10s %9s %11s %9s\n" "$name" "${flops[$name]}" "${steps[$name]}" \
    "$(budget "${steps[$name]}" "${flops[$name]}" "${tokens[$name]}")" "${seconds[$name]}" \
    "$top" "$(delta "$top" "$ref_loss")" "$causal" "$(delta "$causal" "$ref_loss")"
done
echo "(top-C: the training-time routing, which looks at the whole sequence (MoD top-C, MoE expert"
echo " choice); causal: per-token decisions as in sampling (MoD predictor; MoE top-k among experts and"
echo " the no-op). A dense model has one loss, shown in both columns. vs ref: minus $ref's loss.)"
