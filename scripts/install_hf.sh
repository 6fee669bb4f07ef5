#!/usr/bin/env bash
# Installs what the slow:hf tests need (docs/hf.md): torch (scripts/install_torch.sh, the same
# virtual environment slow:torch_training uses), then transformers, tokenizers, safetensors,
# lm-eval and accelerate (which lm-eval's hf model needs). By default into build/pytorch-venv,
# where `ctest -L hf` finds it (or point MOD_HF_PYTHON at another interpreter).
# Usage: scripts/install_hf.sh [VENV_DIR]
set -euo pipefail
venv=${1:-$(cd "$(dirname "$0")/.." && pwd)/build/pytorch-venv}  # the checkout's build/, from anywhere
"$(dirname "$0")/install_torch.sh" "$venv"
"$venv/bin/python" -m pip install --quiet transformers tokenizers safetensors numpy lm-eval accelerate
"$venv/bin/python" -c 'import torch, transformers, tokenizers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "tokenizers", tokenizers.__version__)'
echo "installed into $venv; run: cd build && ctest -L hf"
