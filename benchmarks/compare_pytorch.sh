#!/usr/bin/env bash
# compare_pytorch: modtrain's training-step throughput against the same models in PyTorch
# (benchmarks/pytorch/pytorch_reference.py), dense and MoD, same config, batch, random tokens and thread
# count, in one run, their steps interleaved. Target: modtrain >= 1.5x PyTorch's tokens/s for dense and for MoD.
#
# Usage: benchmarks/compare_pytorch.sh [--config FILE] [--set f=v ...]
# Environment: BUILD_DIR (default build), THREADS (default 2), STEPS timed steps (default 10),
#   TRIAL_STEPS for PyTorch's set-up search (default 2; 0: no search), PYTHON (default: the
#   virtual environment PYTORCH_VENV, default $BUILD_DIR/pytorch-venv, made on first use with
#   TORCH_SPEC from PyPI, default "torch>=2.4,<3": about 5 GB with the CUDA libraries PyPI's Linux
#   wheel depends on; PYTHON=/usr/bin/python3 runs Debian's python3-torch 1.13, the historical
#   row), ATEN_CPU_CAPABILITY (PyTorch's vector
#   kernels; default avx512 where the CPU has AVX-512: Debian's build otherwise stays on AVX2,
#   measured 4-5% slower a step), MKL_AMD_SHIM (default 1: on AMD CPUs PyTorch's MKL runs its
#   AVX-512 path, below; 0: as shipped), MOD_SGEMM (modtrain's f32 GEMM library, core/cpu/blas.h).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
THREADS=${THREADS:-2}
STEPS=${STEPS:-10}
TRIAL_STEPS=${TRIAL_STEPS:-2}
PYTORCH_VENV=${PYTORCH_VENV:-$BUILD_DIR/pytorch-venv}
TORCH_SPEC=${TORCH_SPEC:-torch>=2.4,<3}
BENCH="$BUILD_DIR/benchmarks/train_bench"

[[ -x "$BENCH" ]] || { echo "compare_pytorch: $BENCH missing: build it (cmake --build $BUILD_DIR --target train_bench)" >&2; exit 1; }
if [[ -z "${PYTHON:-}" ]]; then
  PYTHON=$PYTORCH_VENV/bin/python
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "compare_pytorch: installing $TORCH_SPEC from PyPI into $PYTORCH_VENV (once; several GB)"
    TORCH_SPEC=$TORCH_SPEC scripts/install_torch.sh "$PYTORCH_VENV" ||
      { echo "compare_pytorch: could not install $TORCH_SPEC into $PYTORCH_VENV" >&2; exit 1; }
  fi
fi
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "compare_pytorch: $PYTHON cannot import torch" >&2; exit 1; }
echo "PyTorch: $("$PYTHON" -c 'import torch; print(torch.__version__, torch.__file__)')"

source benchmarks/pytorch/pytorch_setup.sh  # ATEN_CPU_CAPABILITY, pytorch_env (the MKL shim on AMD)

# One process pair, steps interleaved (a PyTorch step, then ours, per model and round): a shared
# 2-core VM drifts by 10-30% over tens of seconds, which would otherwise land on one side only.
against=$(printf '%q ' env -u LD_PRELOAD OMP_NUM_THREADS="$THREADS" "$BENCH" --warmup 2 \
  --sample-reps 0 "$@")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "== PyTorch (pytorch_reference.py, $THREADS threads) against modtrain (train_bench --serve) =="
"${pytorch_env[@]}" "$PYTHON" benchmarks/pytorch/pytorch_reference.py --threads "$THREADS" --steps "$STEPS" \
  --trial-steps "$TRIAL_STEPS" --against "$against" "$@" | tee "$out"

read -r our_dense our_mod < <(awk '/^RESULT train_tokens_per_s/ {print $4, $6}' "$out")
read -r pt_dense pt_mod < <(awk '/^RESULT pytorch_tokens_per_s/ {print $4, $6}' "$out")
# Each side's share of the SGEMM ceiling: a step's rate over the ceiling train_bench measured in
# the same round, the median over rounds.
read -r pt_share_dense pt_share_mod our_share_dense our_share_mod < <(
  awk '/^RESULT sgemm_share/ {print $5, $7, $10, $12}' "$out")
echo
echo "== modtrain / PyTorch, training tokens/s (median of interleaved steps; target >= 1.5x) =="
echo "   share: training FLOP/s over the 1024^3 SGEMM rate measured in the same round (median)"
awk -v od="$our_dense" -v om="$our_mod" -v pd="$pt_dense" -v pm="$pt_mod" \
    -v osd="$our_share_dense" -v osm="$our_share_mod" -v psd="$pt_share_dense" \
    -v psm="$pt_share_mod" 'BEGIN {
  split("dense MoD", name, " "); ours[1] = od; ours[2] = om; pt[1] = pd; pt[2] = pm
  os[1] = osd; os[2] = osm; ps[1] = psd; ps[2] = psm
  printf "  %-6s %12s %12s %8s %16s %16s\n", "model", "modtrain", "PyTorch", "ratio",
         "modtrain share", "PyTorch share"
  for (i = 1; i <= 2; ++i) {
    r = ours[i] / pt[i]
    printf "  %-6s %12.0f %12.0f %7.2fx %15.0f%% %15.0f%%  %s\n", name[i], ours[i], pt[i], r,
           100 * os[i], 100 * ps[i], (r >= 1.5 ? "target met" : "BELOW TARGET")
  }
}'
