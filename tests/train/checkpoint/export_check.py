"""Reads an exported checkpoint with the Python safetensors package and compares it with the
weights file train::save_weights wrote for the same model: names, dtypes, shapes, values
(bitwise), the metadata eval and sample rely on, and the weights seal: "crc32c.<name>" holds each
tensor's CRC-32C, recomputed here. Usage: export_check.py EXPORTED EXPECTED"""
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file


def crc32c(b):  # bitwise, independent of core/util/crc32c.cpp's tables
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


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
for path, tensors in ((sys.argv[1], exported), (sys.argv[2], expected)):
    with safe_open(path, framework="numpy") as f:
        seals = {k[len("crc32c."):]: v for k, v in f.metadata().items() if k.startswith("crc32c.")}
    assert sorted(seals) == sorted(tensors), (path, sorted(seals))
    for name, t in tensors.items():
        assert seals[name] == "%08x" % crc32c(t.tobytes()), (path, name, seals[name])
print(f"export_check: {len(exported)} tensors match, seals included")
