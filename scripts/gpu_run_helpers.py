#!/usr/bin/env python3
"""Helpers of scripts/gpu_run.sh, on the lent GPU machine.

  gpu_run_helpers.py libdirs          the lib folders of Python's nvidia packages, ':'-joined
  gpu_run_helpers.py median NAME LOG  median tokens/s and MFU of a `modtrain train` log's step
                                      lines after the second (the warm-up and the capture)
  gpu_run_helpers.py same_losses REF RUN...  each run directory's metrics.csv losses against
                                      REF's, step by step, to the parity suite's relative 1e-5
                                      (tests/support/parity_harness.h); exit 1 on a difference
  gpu_run_helpers.py same_losses_tail REF RUN...  the same for runs resumed from a checkpoint:
                                      their steps are REF's last ones
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


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = [line.split(",") for line in f.read().splitlines()[1:] if line]
    return [(int(r[0]), float(r[1])) for r in rows]  # step, loss: the file's first columns


def same_losses(ref_dir, run_dirs, tolerance=1e-5, tail=False):
    """Every run's losses against REF's at the same steps. A run must have all of REF's steps,
    or with tail=True (a run resumed from a checkpoint) the last ones, from any step on."""
    ref = dict(losses(ref_dir))
    ok = bool(ref)
    for run in run_dirs:
        got = losses(run)
        steps = [s for s, _ in got]
        expected = sorted(ref)[-len(got):] if tail and got else sorted(ref)
        worst = max((abs(g - ref[s]) / abs(ref[s]) for s, g in got if s in ref),
                    default=float("inf"))
        same = bool(got) and steps == expected and worst <= tolerance
        ok &= same
        print(f"  {os.path.basename(run)}: {len(got)} steps ({steps[0] if steps else '-'} to "
              f"{steps[-1] if steps else '-'}), largest relative difference {worst:.2e} against "
              f"{os.path.basename(ref_dir)}: {'ok' if same else 'DIFFERS'}")
    return ok


if __name__ == "__main__":
    if sys.argv[1:2] == ["libdirs"]:
        libdirs()
    elif sys.argv[1:2] == ["median"] and len(sys.argv) == 4:
        median(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["same_losses"] and len(sys.argv) >= 4:
        sys.exit(0 if same_losses(sys.argv[2], sys.argv[3:]) else 1)
    elif sys.argv[1:2] == ["same_losses_tail"] and len(sys.argv) >= 4:
        sys.exit(0 if same_losses(sys.argv[2], sys.argv[3:], tail=True) else 1)
    else:
        sys.exit(__doc__)
