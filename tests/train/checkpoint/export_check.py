"""Reads an exported checkpoint with the Python safetensors package and compares it with the
weights file train::save_weights wrote for the same model: names, dtypes, shapes, values
(bitwise) and the metadata eval and sample rely on. Usage: export_check.py EXPORTED EXPECTED"""
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

exported, expected = load_file(sys.argv[1]), load_file(sys.argv[2])
assert sorted(exported) == sorted(expected), (sorted(exported), sorted(expected))
for name, want in expected.items():
    got = exported[name]
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
with safe_open(sys.argv[1], framework="numpy") as f:
    meta = f.metadata()
assert meta["format"] == "modtrain-weights-1" and meta["step"] == "3", meta
assert "d_model: 16" in meta["config"], meta["config"]
print(f"export_check: {len(exported)} tensors match")
