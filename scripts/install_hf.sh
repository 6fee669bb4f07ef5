#!/usr/bin/env bash
# Installs what the slow:hf tests need (docs/hf.md): torch (CPU wheels), transformers, tokenizers,
# safetensors and numpy, from the package index into a virtual environment, by default
# build/hf-venv, where `ctest -L hf` finds it (or point MOD_HF_PYTHON at another interpreter).
# Usage: scripts/install_hf.sh [VENV_DIR]
set -euo pipefail
venv=${1:-build/hf-venv}
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet --index-url https://download.pytorch.org/whl/cpu torch
"$venv/bin/python" -m pip install --quiet transformers tokenizers safetensors numpy
"$venv/bin/python" -c 'import torch, transformers, tokenizers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__)'
echo "installed into $venv; run: cd build && ctest -L hf"
