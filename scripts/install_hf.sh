#!/usr/bin/env bash
# Installs what the slow:hf tests need (docs/hf.md): torch (CPU wheels), transformers, tokenizers,
# safetensors, numpy, lm-eval and accelerate (which lm-eval's hf model needs), from the package index into a virtual environment, by default
# build/hf-venv, where `ctest -L hf` finds it (or point MOD_HF_PYTHON at another interpreter).
# MOD_TORCH_INDEX: the index of torch's CPU wheels (default PyTorch's).
# Usage: scripts/install_hf.sh [VENV_DIR]
set -euo pipefail
venv=${1:-build/hf-venv}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# PyTorch's CPU wheels when their index answers (about 200 MB); otherwise PyPI's torch, which
# brings CUDA libraries (about 5 GB) and runs on the CPU all the same. Probed first: pip retries
# an unreachable extra index for every package.
torch_index=${MOD_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
extra=()
if "$venv/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/torch/', timeout=10)" \
    "$torch_index" 2> /dev/null; then
  extra=(--extra-index-url "$torch_index")
else
  echo "install_hf: $torch_index does not answer; torch from the default index"
fi
"$venv/bin/python" -m pip install --quiet "${extra[@]}" torch
"$venv/bin/python" -m pip install --quiet transformers tokenizers safetensors numpy lm-eval accelerate
"$venv/bin/python" -c 'import torch, transformers, tokenizers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__)'
echo "installed into $venv; run: cd build && ctest -L hf"
