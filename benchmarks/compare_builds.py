#!/usr/bin/env python3
"""Two builds of train_bench against each other, training steps interleaved.

A shared VM's speed drifts by 10-30% over tens of seconds, so two builds timed one after the
other mostly measure the drift. This runs both as `train_bench --serve` processes and asks them
for steps in turn (the order alternating per round), so both see the same load; it prints each
model's median step and the before/after ratio of medians and per round.

  benchmarks/compare_builds.py BEFORE/train_bench AFTER/train_bench --rounds 8 \
      --config configs/recipes/gpt2_small_mod.textproto --set model.n_layers=8

Arguments after the options go to both train_bench processes. OMP_NUM_THREADS defaults to 2.
"""
import argparse
import os
import statistics
import subprocess
import sys


def start(binary, bench_args, env):
    if not os.access(binary, os.X_OK):
        sys.exit(f"compare_builds: {binary} is not an executable train_bench")
    proc = subprocess.Popen([binary, "--warmup", "2", "--sample-reps", "0", "--serve", *bench_args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    while True:
        line = proc.stdout.readline()
        if not line:
            sys.exit(f"compare_builds: {binary} exited before answering READY (exit {proc.wait()})")
        if line.startswith("FLOPS"):
            print(f"{binary}: {line.strip()}")
        if line.startswith("READY"):
            return proc


def step(proc, model):
    proc.stdin.write(model + "\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", help="train_bench of the build to compare against")
    parser.add_argument("after", help="train_bench of the build under test")
    parser.add_argument("--rounds", type=int, default=8, help="steps per model and build")
    args, bench_args = parser.parse_known_args()
    if args.rounds < 1:
        sys.exit(f"compare_builds: --rounds {args.rounds}: expected at least 1")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    procs = {"before": start(args.before, bench_args, env), "after": start(args.after, bench_args, env)}
    seconds = {(build, model): [] for build in procs for model in ("dense", "mod")}
    for r in range(args.rounds):
        for model in ("dense", "mod"):
            for build in ("before", "after") if r % 2 == 0 else ("after", "before"):
                seconds[(build, model)].append(step(procs[build], model))
    print("model   before ms   after ms   before/after: of medians, per round median (range)")
    for model in ("dense", "mod"):
        before, after = seconds[("before", model)], seconds[("after", model)]
        ratios = sorted(b / a for b, a in zip(before, after))
        b, a = statistics.median(before), statistics.median(after)
        print(f"{model:6s} {b * 1e3:10.1f} {a * 1e3:10.1f}   {b / a:.3f}, {statistics.median(ratios):.3f} "
              f"({ratios[0]:.3f}-{ratios[-1]:.3f})")
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()


if __name__ == "__main__":
    main()
