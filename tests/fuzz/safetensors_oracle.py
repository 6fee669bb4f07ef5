#!/usr/bin/env python3
# safetensors_oracle: modtrain's safetensors reader against the reference, the Python
# `safetensors` library, file by file. Invariant checked: on every file below both accept or both
# refuse. The files: the corpus and regressions of tests/fuzz/ and, from every valid one, its
# mutations in the layout (header length off by a few bytes, bytes inserted, appended or cut,
# data_offsets and shapes moved by one, entries reordered or repeated), where a reader that
# trusts the header reads the wrong bytes. Only dtypes modtrain reads appear. modtrain alone
# checks the weights seal: its refusal of a sealed file whose bytes moved counts as agreement.
# Usage: safetensors_oracle.py VERDICT_TOOL SOURCE_DIR. Exits 77 (skipped) without the library.
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import safetensors
    deserialize = getattr(safetensors, "deserialize", None)
    if deserialize is None:
        from safetensors._safetensors_rust import deserialize
except ImportError as e:
    print(f"safetensors_oracle: skipped: python3 cannot import safetensors ({e}); "
          "scripts/install_deps.sh installs it")
    sys.exit(77)

TOOL, SRC = sys.argv[1], sys.argv[2]
SUPPORTED = {"F32", "F64", "I32", "I64", "BF16"}


def reference(data: bytes) -> str:
    try:
        deserialize(data)
        return "ok"
    except Exception as e:  # SafetensorError, or a JSON error in some versions
        return "refused " + str(e)


def split(data: bytes):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def pack(header: dict, body: bytes) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + body


def mutations(data: bytes):
    n = struct.unpack("<Q", data[:8])[0]
    for d in (-8, -2, -1, 1, 2, 8):  # header length off
        if 0 <= n + d:
            yield f"length{d:+}", struct.pack("<Q", n + d) + data[8:]
    for k in (1, 4, 8):
        yield f"insert{k}", data[:8 + n] + b"\0" * k + data[8 + n:]
        yield f"append{k}", data + b"\0" * k
        if len(data) - k >= 8 + n:
            yield f"cut{k}", data[:-k]
    yield "pad_header", struct.pack("<Q", n + 4) + data[8:8 + n] + b"    " + data[8 + n:]
    try:
        header, body = split(data)
    except Exception:
        return
    names = [k for k in header if k != "__metadata__"]
    for name in names:
        for i in (0, 1):
            for d in (-1, 1):
                h = json.loads(json.dumps(header))
                h[name]["data_offsets"][i] += d
                if h[name]["data_offsets"][i] >= 0:
                    yield f"{name}.offset{i}{d:+}", pack(h, body)
        h = json.loads(json.dumps(header))
        if h[name]["shape"]:
            h[name]["shape"][0] += 1
            yield f"{name}.shape+1", pack(h, body)
        h = json.loads(json.dumps(header))
        h[name]["data_offsets"] = [0, h[name]["data_offsets"][1] - h[name]["data_offsets"][0]]
        yield f"{name}.from0", pack(h, body)
    if len(names) >= 2:  # two entries' offsets swapped; the header in reverse order
        h = json.loads(json.dumps(header))
        a, b = names[0], names[1]
        h[a]["data_offsets"], h[b]["data_offsets"] = h[b]["data_offsets"], h[a]["data_offsets"]
        yield "swapped", pack(h, body)
        yield "reversed", pack(dict(reversed(list(header.items()))), body)


def main() -> int:
    files = {}
    for kind in ("corpus", "regressions"):
        for p in sorted(glob.glob(os.path.join(SRC, "tests", "fuzz", kind, "safetensors", "*"))):
            data = open(p, "rb").read()
            files[f"{kind}/{os.path.basename(p)}"] = data
            if reference(data) == "ok":
                for label, m in mutations(data):
                    files[f"{kind}/{os.path.basename(p)}:{label}"] = m
    # Only what modtrain reads: a dtype it does not know is refused by design.
    keep = {}
    for label, data in files.items():
        try:
            header, _ = split(data)
            if any(isinstance(v, dict) and v.get("dtype") not in SUPPORTED
                   for k, v in header.items() if k != "__metadata__"):
                continue
        except Exception:
            pass
        keep[label] = data
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, data in enumerate(keep.values()):
            paths.append(os.path.join(tmp, f"{i}.safetensors"))
            with open(paths[-1], "wb") as f:
                f.write(data)
        ours = subprocess.run([TOOL] + paths, check=True, stdout=subprocess.PIPE,
                              text=True).stdout.splitlines()
    mismatches, accepted = 0, 0
    for (label, data), mine in zip(keep.items(), ours):
        ref = reference(data)
        accepted += ref == "ok"
        if ref == "ok" and "its seal says" in mine:  # tensors moved under their seal
            continue
        if (mine == "ok") != (ref == "ok"):
            mismatches += 1
            print(f"MISMATCH {label}: modtrain {mine[:160]!r}, reference {ref[:160]!r}")
    print(f"safetensors_oracle: {len(keep)} files ({accepted} accepted by the reference), "
          f"{mismatches} verdicts differ")
    return 1 if mismatches or len(ours) != len(keep) or accepted == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
