#!/usr/bin/env python3
"""slow:torch_training: modtrain's training trajectory against PyTorch's, step by step.

The PyTorch twin (tests/train/torch_training_twin.py) writes its initial weights as safetensors;
`modtrain train --init-from` starts from the same file. Both train 30 steps (10 of warm-up, then
the cosine; lr 5e-4, as the recipes' 2e-3 is chaotic over a 10-step warm-up) on the same batches
of one prepared byte-level dataset (the twin reads the shards and modtrain's data order itself)
and the per-step language-model loss (metrics.csv's lm_loss) must agree to 1e-5 relative, for
configs/recipes/tiny_dense, tiny_mod, and tiny_mod with gradient accumulation 2, except after a
top-C swap (compare()). Every step is clipped, so the clip convention is exercised throughout.
docs/training.md, "Checked against PyTorch", has the measurements.

torch comes from MOD_TORCH_PYTHON (a Python that can import it) or the virtual environment
scripts/install_torch.sh makes (default build/pytorch-venv, passed by CTest as --venv). Without
torch the test prints why and exits 77 (CTest: skipped).

Usage: tests/train/torch_training_test.py MODTRAIN SOURCE_DIR [--venv DIR] [--keep DIR]
"""
import argparse
import csv
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

STEPS, WARMUP, LR, RTOL = 30, 10, 5e-4, 1e-5
# A routed block's top-C is discontinuous: see compare().
TIE, SWAP_RTOL = 1e-4, 1e-3
CASES = [("tiny_dense", "tiny_dense.textproto", []),
         ("tiny_mod", "tiny_mod.textproto", []),
         ("tiny_mod, grad_accum 2", "tiny_mod.textproto", ["train.grad_accum=2"])]


def torch_python(venv):
    candidates = [os.environ["MOD_TORCH_PYTHON"]] if os.environ.get("MOD_TORCH_PYTHON") else []
    candidates.append(os.path.join(venv, "bin", "python"))
    for py in candidates:
        if shutil.which(py) and subprocess.run([py, "-c", "import torch"],
                                               capture_output=True).returncode == 0:
            return py
    env = os.environ.get("MOD_TORCH_PYTHON")
    print("SKIP torch_training: no Python with torch ("
          + (f"MOD_TORCH_PYTHON={env} cannot import it, " if env else "MOD_TORCH_PYTHON unset, ")
          + f"{candidates[-1]} missing or without it); install it with scripts/install_torch.sh {venv}")
    sys.exit(77)


def compare(ours, theirs, margins):
    """Every step within RTOL, except after a top-C swap: a step beyond RTOL whose forward had
    two tokens' router scores within TIE of the largest score (float32 rounding in two programs
    can order them differently, measured at 1.0e-5) starts SWAP_RTOL for the rest of the run.
    Returns (passed, one line)."""
    tol, swap, worst = RTOL, None, [0.0, 0.0]
    for step, (a, b, m) in enumerate(zip(ours, theirs, margins), 1):
        rel = abs(a - b) / abs(b)
        if rel > tol and swap is None and m < TIE:
            swap, tol = step, SWAP_RTOL
        if rel > tol:
            return False, (f"step {step}: modtrain {a:.9g}, PyTorch {b:.9g}, relative gap {rel:.2e} > {tol:g}"
                           f" (closest top-C tie of the step: {m:.3g} of the largest router score)")
        worst[swap is not None] = max(worst[swap is not None], rel)
    if swap is None:
        return True, f"largest relative gap {worst[0]:.2e} (<= {RTOL:g} every step)"
    return True, (f"largest relative gap {worst[0]:.2e} up to step {swap - 1}; a top-C swap at step "
                  f"{swap} (tie {margins[swap - 1]:.3g}), then {worst[1]:.2e} (<= {SWAP_RTOL:g})")


def run(cmd, **kw):
    # PyTorch's OpenMP spins while it waits, as modtrain's did: on a shared machine that costs
    # it several times its speed (docs/performance.md, "Threads on a shared machine").
    env = dict(os.environ)
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if r.returncode != 0:
        sys.exit(f"torch_training: {' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modtrain")
    ap.add_argument("source_dir")
    ap.add_argument("--venv", default="build/pytorch-venv")
    ap.add_argument("--keep", help="work in this folder and keep it")
    ap.add_argument("--only", help="run only the case with this label, e.g. tiny_mod")
    args = ap.parse_args()
    py = torch_python(args.venv)
    src = os.path.abspath(args.source_dir)
    twin = os.path.join(src, "tests", "train", "torch_training_twin.py")
    work = args.keep or tempfile.mkdtemp(prefix="torch_training_")
    os.makedirs(work, exist_ok=True)
    start = time.time()
    try:
        # A byte-level corpus from the repository's own docs (about 400 KB, 1,400 windows of 256
        # tokens; 30 steps take at most 480 of them).
        corpus = os.path.join(work, "corpus.txt")
        with open(corpus, "wb") as out:
            for path in sorted(glob.glob(os.path.join(src, "docs", "*.md"))):
                with open(path, "rb") as f:
                    out.write(f.read() + b"\n\n")
        data = os.path.join(work, "data")
        shutil.rmtree(data, ignore_errors=True)
        run([args.modtrain, "prep", "--input", corpus, "--out", data, "--val-fraction", "0.1"])
        failed = 0
        cases = [c for c in CASES if not args.only or c[0] == args.only]
        for label, recipe, extra in cases:
            config = os.path.join(src, "configs", "recipes", recipe)
            sets = [f"train.steps={STEPS}", f"optimizer.warmup_steps={WARMUP}",
                    f"optimizer.lr={LR}", f"optimizer.min_lr={LR / 10}", "train.eval_every=0"] + extra
            tag = label.replace(", ", "_").replace(" ", "")
            init = os.path.join(work, f"{tag}_init.safetensors")
            setargs = [a for s in sets for a in ("--set", s)]
            run([py, twin, "write-init", config, init] + setargs)
            run_dir = os.path.join(work, f"{tag}_run")
            shutil.rmtree(run_dir, ignore_errors=True)
            run([args.modtrain, "train", "--config", config, "--run-dir", run_dir, "--data", data,
                 "--init-from", init] + setargs)
            with open(os.path.join(run_dir, "metrics.csv")) as f:
                ours = [float(row["lm_loss"]) for row in csv.DictReader(f) if row.get("lm_loss")]
            theirs_path = os.path.join(work, f"{tag}_torch.txt")
            run([py, twin, "train", config, init, data, theirs_path] + setargs)
            with open(theirs_path) as f:
                rows = [line.split() for line in f]
            theirs, margins = [float(r[0]) for r in rows], [float(r[1]) for r in rows]
            if len(ours) != STEPS or len(theirs) != STEPS:
                print(f"{label}: {len(ours)} modtrain losses and {len(theirs)} PyTorch losses, expected {STEPS}")
                failed += 1
                continue
            ok, report = compare(ours, theirs, margins)
            print(f"{label}: {STEPS} steps, loss {ours[0]:.6f} -> {ours[-1]:.6f} (modtrain), "
                  f"{theirs[0]:.6f} -> {theirs[-1]:.6f} (PyTorch); {report}")
            failed += not ok
        print(f"torch_training: {len(cases) - failed} of {len(cases)} passed in {time.time() - start:.0f} s")
        return 1 if failed else 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
