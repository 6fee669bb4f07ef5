#!/usr/bin/env bash
# Tokenizer seals end to end (issue 43): prep records the tokenizer's CRC-32C in the manifest,
# train copies it into the checkpoint and model.safetensors, export into its weights file; after
# a one-bit change to a merge line of tokenizer.txt, train, eval and sample (of weights, a
# checkpoint and an export) refuse, naming both files and both CRCs. A tokenizer that is no
# regular file is refused by name. Usage: tokenizer_seal_cli_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "tokenizer_seal_cli_test: $*" >&2; exit 1; }
tiny=(--set model.d_model=32 --set model.n_heads=2 --set model.d_ff=64 --set model.n_layers=2
      --set model.seq_len=32 --set optimizer.warmup_steps=1 --set train.eval_batches=1
      --set model.vocab_size=300)

cat "$src"/docs/*.md > "$work/corpus.txt"
"$modtrain" prep --input "$work/corpus.txt" --out "$work/data" --tokenizer bpe --vocab-size 300 \
  --val-fraction 0.1 > /dev/null
crc=$(sed -nE 's/^tokenizer_crc32c: ([0-9]+)$/\1/p' "$work/data/dataset.textproto")
[ -n "$crc" ] || fail "the manifest has no tokenizer_crc32c"
"$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" --run-dir "$work/run" \
  --data "$work/data" "${tiny[@]}" --set train.steps=2 --set train.eval_every=2 \
  --set checkpoint.every_steps=2 > /dev/null
ckpt=$(ls -d "$work"/run/checkpoints/step_* | head -1)
"$modtrain" export --checkpoint "$ckpt" --format safetensors --out "$work/export.safetensors" > /dev/null
for w in "$work/run/model.safetensors" "$ckpt" "$work/export.safetensors"; do
  "$modtrain" sample --checkpoint "$w" --prompt "The" --max-new-tokens 2 > /dev/null \
    || fail "sample of $w failed before any change"
done
sealed=$(printf '%08x' "$crc")
grep -q "\"tokenizer_crc32c\":\"$sealed\"" "$work/run/model.safetensors" \
  || fail "model.safetensors does not carry the tokenizer's CRC $sealed"

# One bit of merge 0 (line 5): a valid, different tokenizer.
python3 - "$work/data/tokenizer.txt" <<'PY'
import sys
lines = open(sys.argv[1], "rb").read().split(b"\n")
lines[4] = lines[4][:-1] + bytes([lines[4][-1] ^ 1])
open(sys.argv[1], "wb").write(b"\n".join(lines))
PY
refuses() {  # refuses LOG COMMAND...: fails, naming the tokenizer, the holder and both CRCs
  local log=$1; shift
  if "$@" > "$log" 2>&1; then fail "$* succeeded with a changed tokenizer"; fi
  grep -q "tokenizer $work/data/tokenizer.txt has CRC-32C [0-9a-f]\{8\}, but .* was made with one of CRC-32C $sealed" "$log" \
    || fail "$* did not name the tokenizer and both CRCs: $(cat "$log")"
}
refuses "$work/eval.log" "$modtrain" eval --checkpoint "$work/run/model.safetensors" --batches 1
grep -q "dataset $work/data/dataset.textproto" "$work/eval.log" || fail "eval did not name the manifest"
refuses "$work/train.log" "$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" \
  --run-dir "$work/run" --data "$work/data" "${tiny[@]}" --set train.steps=4 --resume auto
for w in "$work/run/model.safetensors" "$ckpt" "$work/export.safetensors"; do
  refuses "$work/sample.log" "$modtrain" sample --checkpoint "$w" --prompt "The" --max-new-tokens 2
done

# A manifest older than the seal: the dataset opens, the weights' seal still catches the change.
sed -i '/^tokenizer_crc32c:/d' "$work/data/dataset.textproto"
refuses "$work/sample.log" "$modtrain" sample --checkpoint "$work/run/model.safetensors" --prompt "The"
grep -q "weights $work/run/model.safetensors" "$work/sample.log" || fail "sample did not name the weights"
refuses "$work/sample.log" "$modtrain" sample --checkpoint "$ckpt" --prompt "The"
grep -q "checkpoint $ckpt/metadata.pb" "$work/sample.log" || fail "sample did not name the checkpoint"

# Not a regular file: refused at once, by name (it was read until memory ran out).
if timeout 20 "$modtrain" sample --checkpoint "$work/run/model.safetensors" --tokenizer /dev/zero \
    > "$work/zero.log" 2>&1; then fail "sample --tokenizer /dev/zero succeeded"; fi
grep -q "tokenizer /dev/zero: not a regular file" "$work/zero.log" \
  || fail "--tokenizer /dev/zero: $(cat "$work/zero.log")"
echo "tokenizer_seal_cli_test: all checks passed"
