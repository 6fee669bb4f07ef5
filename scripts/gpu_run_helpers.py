#!/usr/bin/env python3
"""Helpers of scripts/gpu_run.sh, on the lent GPU machine.

  gpu_run_helpers.py libdirs          the lib folders of Python's nvidia packages, ':'-joined
  gpu_run_helpers.py median NAME LOG  median tokens/s and MFU of a `modtrain train` log's step
                                      lines after the second (the warm-up and the capture)
"""
import glob
import os
import re
import statistics
import sys


def libdirs():
    try:
        import nvidia  # the CUDA libraries PyTorch's wheels bring
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    dirs = {os.path.dirname(p) for r in roots for p in glob.glob(r + "/*/lib/*.so*")}
    print(":".join(sorted(dirs)))


def median(name, log):
    text = open(log, errors="replace").read()
    rows = re.findall(r"^step .*?([0-9.]+) tok/s \| MFU +([0-9.]+)%", text, re.M)[2:]
    if not rows:
        print(f"  {name}: no step lines past the second")
        return
    tok = statistics.median(float(t) for t, _ in rows)
    mfu = statistics.median(float(m) for _, m in rows)
    print(f"  {name}: median of {len(rows)} steps: {tok:.0f} tok/s, MFU {mfu:.1f}%")


if __name__ == "__main__":
    if sys.argv[1:2] == ["libdirs"]:
        libdirs()
    elif sys.argv[1:2] == ["median"] and len(sys.argv) == 4:
        median(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
