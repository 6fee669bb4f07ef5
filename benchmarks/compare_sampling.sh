#!/usr/bin/env bash
# compare_sampling: modtrain's KV-cache sampling (train_bench's second half) against PyTorch's
# decoding of the same model (benchmarks/pytorch/pytorch_decode.py), dense and MoD, batch 1, temperature
# 1, predictors calibrated to admit model.mod.capacity of the tokens on both sides. The two run
# alternately, ROUNDS times each, so a drift of this VM's speed lands on both. Target: modtrain
# ahead of PyTorch 2.x (issue 23).
#
# Usage: benchmarks/compare_sampling.sh [--config FILE] [--set f=v ...]
# Environment: BUILD_DIR (default build), THREADS (default 2), ROUNDS (default 3), REPS timed
#   generations per model and round (default 8), PYTHON (default: compare_pytorch.sh's virtual
#   environment, $BUILD_DIR/pytorch-venv; run compare_pytorch.sh once to make it), and those of
#   benchmarks/pytorch/pytorch_setup.sh (ATEN_CPU_CAPABILITY, MKL_AMD_SHIM).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
REPS=${REPS:-8}
PYTHON=${PYTHON:-$BUILD_DIR/pytorch-venv/bin/python}
BENCH="$BUILD_DIR/benchmarks/train_bench"
[[ -x "$BENCH" ]] || { echo "compare_sampling: $BENCH missing (cmake --build $BUILD_DIR --target train_bench)" >&2; exit 1; }
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "compare_sampling: $PYTHON cannot import torch (benchmarks/compare_pytorch.sh installs it)" >&2; exit 1; }
source benchmarks/pytorch/pytorch_setup.sh  # ATEN_CPU_CAPABILITY, pytorch_env (the MKL shim on AMD)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for round in $(seq "$ROUNDS"); do
  echo "== round $round: modtrain (train_bench) =="
  OMP_NUM_THREADS=$THREADS "$BENCH" --steps 1 --warmup 0 --sample-reps "$REPS" "$@" |
    grep -E "tok/s \||admitted fraction|^RESULT sample" | tee -a "$log"
  echo "== round $round: PyTorch (pytorch_decode.py) =="
  "${pytorch_env[@]}" "$PYTHON" benchmarks/pytorch/pytorch_decode.py --threads "$THREADS" --reps "$REPS" "$@" 2>/dev/null |
    grep -vE "^W[0-9]" | tee -a "$log"
done

echo
echo "== sampling tokens/s, median over $ROUNDS rounds: modtrain / PyTorch (best set-up) =="
awk '
  /^RESULT sample_tokens_per_s/ { od[++n1] = $4; om[n1] = $6 }
  /^RESULT pytorch_sample_tokens_per_s/ { pd[++n2] = $4; pm[n2] = $6 }
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    d1 = median(od, n1); m1 = median(om, n1); d2 = median(pd, n2); m2 = median(pm, n2)
    printf "  %-6s %10s %10s %8s\n", "model", "modtrain", "PyTorch", "ratio"
    printf "  %-6s %10.1f %10.1f %7.2fx\n", "dense", d1, d2, d1 / d2
    printf "  %-6s %10.1f %10.1f %7.2fx\n", "MoD", m1, m2, m1 / m2
    printf "  MoD/dense: modtrain %.2fx, PyTorch %.2fx\n", m1 / d1, m2 / d2
  }' "$log"
