#!/usr/bin/env python3
"""A rank's memory does not grow with the dataset: `modtrain train` runs a few steps on a dataset
of 1M tokens and on one of 4 shards x 1G tokens (8 GiB), and the peak resident set sizes
(VmHWM, from the child's own rusage) must differ by less than BOUND_DELTA_MB, with the large run
under BOUND_MB. The shards are sparse files (a header and a hole of zeros, which are valid
tokens), so the test costs no disk; `--real` writes 2 x 1 GiB of random tokens instead (slow).

  memory_bound_test.py MODTRAIN SOURCE_DIR [--real]
"""
import os
import struct
import subprocess
import sys
import tempfile

BOUND_MB = 400        # the large run's peak RSS
BOUND_DELTA_MB = 32   # large minus small


def shard(path, tokens, real):
    """A modtrain shard of `tokens` uint16 tokens (vocab 256)."""
    with open(path, "wb") as f:
        f.write(b"MODTOKS1" + struct.pack("<IIIIQ", 1, 2, 256, 0, tokens))
        if not real:
            f.truncate(32 + 2 * tokens)
            return
        chunk = 1 << 26
        left = tokens
        while left:
            n = min(chunk, left)
            block = bytearray(2 * n)
            block[0::2] = os.urandom(n)  # little-endian uint16 tokens below 256
            f.write(block)
            left -= n


def dataset(root, name, train_shards, tokens, real):
    d = os.path.join(root, name)
    os.makedirs(d)
    lines = ["version: 1", "vocab_size: 256"]
    for i in range(train_shards):
        shard(os.path.join(d, f"train_{i:06d}.bin"), tokens, real)
        lines.append(f'train {{ path: "train_{i:06d}.bin" tokens: {tokens} }}')
    shard(os.path.join(d, "val_000000.bin"), 100000, False)
    lines.append('val { path: "val_000000.bin" tokens: 100000 }')
    with open(os.path.join(d, "dataset.textproto"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return d


def peak_rss_mb(modtrain, src, data, run_dir):
    """Peak RSS of one `modtrain train` child process, in MiB."""
    cmd = [modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_mod.textproto"),
           "--run-dir", run_dir, "--data", data,
           "--set", "model.d_model=64", "--set", "model.n_heads=2", "--set", "model.d_ff=128",
           "--set", "model.n_layers=2", "--set", "model.seq_len=256", "--set", "train.steps=6",
           "--set", "train.batch_size=16", "--set", "train.eval_every=6",
           "--set", "train.eval_batches=1"]
    log = os.path.join(run_dir + ".log")
    with open(log, "w") as out:
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 env=dict(os.environ, OMP_NUM_THREADS="2"))
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
    if status != 0:
        sys.exit(f"memory_bound_test: train failed on {data}:\n" + open(log).read())
    return usage.ru_maxrss / 1024


def main():
    modtrain, src = sys.argv[1], sys.argv[2]
    real = "--real" in sys.argv[3:]
    with tempfile.TemporaryDirectory() as root:
        small = dataset(root, "small", 1, 1 << 20, False)
        large = dataset(root, "large", 2 if real else 4, 1 << 29 if real else 1 << 30, real)
        size_gb = sum(os.path.getsize(os.path.join(large, f)) for f in os.listdir(large)) / 2**30
        small_mb = peak_rss_mb(modtrain, src, small, os.path.join(root, "run_small"))
        large_mb = peak_rss_mb(modtrain, src, large, os.path.join(root, "run_large"))
    print(f"peak RSS: {small_mb:.1f} MiB on 1M tokens, {large_mb:.1f} MiB on {size_gb:.1f} GiB "
          f"of shards (bounds: {BOUND_MB} MiB, difference {BOUND_DELTA_MB} MiB)")
    if large_mb > BOUND_MB or large_mb - small_mb > BOUND_DELTA_MB:
        sys.exit("memory_bound_test: peak RSS grows with the dataset")


if __name__ == "__main__":
    main()
