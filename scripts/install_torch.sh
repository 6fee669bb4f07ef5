#!/usr/bin/env bash
# install_torch: a virtual environment with PyTorch for the tests and benchmarks that compare
# against it (slow:torch_training, benchmarks/compare_pytorch.sh; scripts/install_hf.sh adds
# transformers to the same one). PyTorch's CPU wheels when their index answers (about 200 MB);
# otherwise PyPI's default wheel, used on the CPU all the same, which pulls its CUDA libraries
# too (several GB). Idempotent: a venv that imports torch is kept.
#
# Usage: scripts/install_torch.sh [VENV]   (default build/pytorch-venv, where CTest looks)
# Environment: TORCH_SPEC (default "torch>=2.4,<3"), PYTHON (the interpreter that makes the
#   venv, default python3), MOD_TORCH_INDEX (the CPU wheels' index, default PyTorch's).
set -euo pipefail
venv=${1:-$(cd "$(dirname "$0")/.." && pwd)/build/pytorch-venv}  # the checkout's build/, from anywhere
spec=${TORCH_SPEC:-torch>=2.4,<3}
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "install_torch: $venv already has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  exit 0
fi
start=$(date +%s)
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# Probed first: pip retries an unreachable extra index for every package.
torch_index=${MOD_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
extra=()
if "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" \
    "$torch_index" 2> /dev/null; then
  extra=(--extra-index-url "$torch_index")
else
  echo "install_torch: $torch_index does not answer; torch from the default index"
fi
"$venv/bin/pip" install -q "${extra[@]}" "$spec" numpy
echo "install_torch: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $venv" \
  "($(( $(date +%s) - start )) s)"
echo "install_torch: the tests find it there (CTest's default) or through MOD_TORCH_PYTHON=$venv/bin/python"
