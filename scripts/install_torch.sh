#!/usr/bin/env bash
# install_torch: a virtual environment with PyTorch for the tests and benchmarks that compare
# against it (slow:torch_training, benchmarks/compare_pytorch.sh). PyPI's default wheel, used on
# the CPU: the pytorch.org CPU-only index is not needed (nor always reachable); on Linux that
# wheel pulls its CUDA libraries too, several GB. Idempotent: a venv that imports torch is kept.
#
# Usage: scripts/install_torch.sh [VENV]   (default build/pytorch-venv, where CTest looks)
# Environment: TORCH_SPEC (default "torch>=2.4,<3"), PYTHON (the interpreter that makes the
#   venv, default python3).
set -euo pipefail
venv=${1:-build/pytorch-venv}
spec=${TORCH_SPEC:-torch>=2.4,<3}
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "install_torch: $venv already has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  exit 0
fi
start=$(date +%s)
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "$spec" numpy
echo "install_torch: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $venv" \
  "($(( $(date +%s) - start )) s)"
echo "install_torch: the tests find it there (CTest's default) or through MOD_TORCH_PYTHON=$venv/bin/python"
