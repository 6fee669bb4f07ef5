#!/usr/bin/env bash
# equal_flops: tiny_dense and tiny_mod trained for the same training FLOPs on the KJV corpus,
# then evaluated side by side. The MoD run gets steps_dense * flops_dense / flops_mod steps,
# both per-token training FLOPs read from `modtrain flops`; batch and sequence length are the
# recipes' (tokens per step enter the budget too).
#
# Usage: benchmarks/equal_flops.sh
# Environment: DENSE_STEPS scales the budget (default 300, the recipe's: ~6 minutes for both runs
#   on 2 idle cores), BUILD_DIR (default build), DATA (default data/kjv), RUN_ROOT (default
#   runs/equal_flops), EVAL_BATCHES validation batches (default 16, of 8 sequences).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
DENSE_STEPS=${DENSE_STEPS:-300}
DATA=${DATA:-data/kjv}
RUN_ROOT=${RUN_ROOT:-runs/equal_flops}
EVAL_BATCHES=${EVAL_BATCHES:-16}
MODTRAIN="$BUILD_DIR/launcher/modtrain"
DENSE=configs/recipes/tiny_dense.textproto
MOD=configs/recipes/tiny_mod.textproto

[[ -x "$MODTRAIN" ]] || { echo "equal_flops: $MODTRAIN missing: build it (cmake --build $BUILD_DIR)" >&2; exit 1; }
if [[ ! -f "$DATA/train.bin" ]]; then
  echo "== preparing $DATA (modtrain prep --kjv) =="
  "$MODTRAIN" prep --kjv --out "$DATA"
fi

training_flops() {  # per-token training FLOPs of a recipe
  "$MODTRAIN" flops --config "$1" | sed -n 's/.*training \([0-9.e+-]*\) FLOPs\/token.*/\1/p'
}
flops_dense=$(training_flops "$DENSE")
flops_mod=$(training_flops "$MOD")
[[ -n "$flops_dense" && -n "$flops_mod" ]] || { echo "equal_flops: cannot read 'modtrain flops'" >&2; exit 1; }
field() { sed -n "s/^ *$1: *\([0-9]*\).*/\1/p" "$2" | head -1; }  # a recipe's integer field
tokens_per_step() { echo $(($(field batch_size "$1") * $(field seq_len "$1"))); }
tok_dense=$(tokens_per_step "$DENSE")
tok_mod=$(tokens_per_step "$MOD")
mod_steps=$(awk -v s="$DENSE_STEPS" -v d="$flops_dense" -v m="$flops_mod" -v td="$tok_dense" -v tm="$tok_mod" \
  'BEGIN { printf "%d", s * d * td / (m * tm) + 0.5 }')
budget() { awk -v s="$1" -v f="$2" -v t="$3" 'BEGIN { printf "%.3g", s * f * t }'; }
echo "== equal training FLOPs: dense $flops_dense FLOPs/token x $DENSE_STEPS steps = MoD $flops_mod x $mod_steps steps =="
echo "   budget $(budget "$DENSE_STEPS" "$flops_dense" "$tok_dense") (dense) vs $(budget "$mod_steps" "$flops_mod" "$tok_mod") (MoD) FLOPs"

train() {  # name recipe steps
  local start=$SECONDS
  echo
  echo "== train $1: $3 steps =="
  "$MODTRAIN" train --config "$2" --run-dir "$RUN_ROOT/$1" --data "$DATA" --set "train.steps=$3" \
    --set train.log_every=50 --set train.eval_every=0
  echo "   $1 trained in $((SECONDS - start)) s"
}
train tiny_dense "$DENSE" "$DENSE_STEPS"
train tiny_mod "$MOD" "$mod_steps"

echo
dense_eval=$("$MODTRAIN" eval --checkpoint "$RUN_ROOT/tiny_dense/model.safetensors" --data "$DATA" --batches "$EVAL_BATCHES")
mod_eval=$("$MODTRAIN" eval --checkpoint "$RUN_ROOT/tiny_mod/model.safetensors" --data "$DATA" --batches "$EVAL_BATCHES")
echo "$dense_eval"
echo "$mod_eval"
loss_of() { sed -n "s/.*$1[^:]*: *\([0-9.]*\).*/\1/p" <<<"$2"; }
echo
echo "== validation loss at equal training FLOPs ($EVAL_BATCHES batches of 8 sequences from $DATA/val.bin) =="
printf "  %-10s %6s %12s %16s %16s\n" model steps "train FLOPs" "loss top-C" "loss causal"
printf "  %-10s %6s %12s %16s %16s\n" tiny_dense "$DENSE_STEPS" "$(budget "$DENSE_STEPS" "$flops_dense" "$tok_dense")" \
  "$(loss_of 'top-C routing' "$dense_eval")" "-"
printf "  %-10s %6s %12s %16s %16s\n" tiny_mod "$mod_steps" "$(budget "$mod_steps" "$flops_mod" "$tok_mod")" \
  "$(loss_of 'top-C routing' "$mod_eval")" "$(loss_of 'causal routing' "$mod_eval")"
echo "(top-C: the training-time routing, which looks at the whole sequence; causal: the predictor's"
echo " per-token decisions, as in sampling. A dense model has only the first.)"
