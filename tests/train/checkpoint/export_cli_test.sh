#!/usr/bin/env bash
# `modtrain export` end to end: a checkpoint written by checkpoint_tests' [.export_fixture] case
# (a tiny model saved in pieces) exports from its run directory; bad --format and a missing
# checkpoint fail naming the culprit; a flipped data byte is refused by its seal. With --python,
# the exported file is also read by the Python safetensors package and compared with
# train::save_weights' file of the same model, seals included (exit 77, a CTest skip, when
# python3 lacks safetensors or numpy).
# Usage: export_cli_test.sh MODTRAIN CHECKPOINT_TESTS [--python]
set -euo pipefail
modtrain=$1
fixture=$2
mode=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "export_cli_test: $*" >&2; exit 1; }

if [ "$mode" = "--python" ] && ! python3 -c "import safetensors.numpy, numpy" 2> /dev/null; then
  echo "export_cli_test: skipped: python3 has no safetensors (or numpy) package"
  exit 77
fi

MOD_EXPORT_FIXTURE_DIR=$work "$fixture" "[.export_fixture]" > "$work/fixture.log" \
  || fail "fixture failed: $(cat "$work/fixture.log")"
"$modtrain" export --checkpoint "$work/run" --format safetensors \
  --out "$work/exported.safetensors" > "$work/export.log"
grep -q "step_00000003 (step 3)" "$work/export.log" \
  || fail "export did not report: $(cat "$work/export.log")"
[ -s "$work/exported.safetensors" ] || fail "no exported file"

expect_error() {  # expect_error PATTERN command...
  local pattern=$1; shift
  if "$@" > "$work/out.log" 2> "$work/err.log"; then fail "succeeded: $*"; fi
  grep -q -- "$pattern" "$work/err.log" \
    || fail "error for '$*' lacks '$pattern': $(cat "$work/err.log")"
}
expect_error "'onnx' is not supported (accepted: safetensors, hf)" \
  "$modtrain" export --checkpoint "$work/run" --format onnx --out "$work/x"
expect_error "$work/nowhere: neither a checkpoint directory" \
  "$modtrain" export --checkpoint "$work/nowhere" --out "$work/x"
expect_error "out" "$modtrain" export --checkpoint "$work/run"

# The weights seal: one flipped bit in the last tensor's last byte (still finite) is refused by
# the loader eval, sample and inspect share, naming the file and the tensor.
cp "$work/exported.safetensors" "$work/flipped.safetensors"
size=$(stat -c %s "$work/flipped.safetensors")
last=$(tail -c 1 "$work/flipped.safetensors" | od -An -tu1 | tr -d ' ')
printf "\\x$(printf %02x $((last ^ 1)))" \
  | dd of="$work/flipped.safetensors" bs=1 seek=$((size - 1)) conv=notrunc status=none
expect_error "safetensors $work/flipped.safetensors: tensor '.*': its data has CRC-32C" \
  "$modtrain" sample --checkpoint "$work/flipped.safetensors" --max-new-tokens 1

if [ "$mode" = "--python" ]; then
  python3 "$here/export_check.py" "$work/exported.safetensors" "$work/expected.safetensors"
fi
echo "export_cli_test: all checks passed"
