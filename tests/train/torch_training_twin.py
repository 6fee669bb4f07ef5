#!/usr/bin/env python3
"""torch_training_twin: modtrain's training step in PyTorch, for slow:torch_training
(tests/train/torch_training_test.py runs it with the Python that has torch).

The model is benchmarks/pytorch/pytorch_reference.py's twin; everything around it follows
docs/training.md with PyTorch's own pieces: torch.optim.AdamW (decoupled decay, eps outside the
bias-corrected square root), the warm-up + cosine schedule of train/lr_schedule.cpp as a
LambdaLR, torch.nn.utils.clip_grad_norm_ (factor max / (norm + 1e-6)) over the language model's
parameters and, apart, over MoD's predictors (model.mod.causal.predictor_grad_clip), and the
MATRICES decay policy (every 2-D weight but the embedding). The batches are modtrain's: the
loader's Feistel permutation of the training shards' windows (train/data/permutation.cpp,
train/data/loader.cpp) read from the shards' documented format (docs/data.md).

  write-init CONFIG OUT.safetensors [--set f=v ...]   the twin's initial weights, modtrain's names
  train CONFIG INIT.safetensors DATA_DIR OUT.txt [--set f=v ...]   a line per step: the lm loss
      and the smallest top-C tie margin of its forward passes (inf without routing)
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "benchmarks", "pytorch"))
import pytorch_reference as ref  # noqa: E402

MASK64 = (1 << 64) - 1
EXTRA_DEFAULTS = {"optimizer.min_lr": 1e-4, "optimizer.warmup_steps": 50, "train.steps": 200,
                  "train.grad_accum": 1, "model.mod.causal.predictor_grad_clip": 1.0}


# --- names: the twin's parameters as modtrain calls them (model/parameter_shapes.cpp) ---

def modtrain_name(name):
    parts = name.split(".")
    if parts[0] != "blocks":
        return name
    rest = ".".join(parts[2:])
    renamed = {"wq.weight": "attn.wq.weight", "wk.weight": "attn.wk.weight",
               "wv.weight": "attn.wv.weight", "wo.weight": "attn.wo.weight",
               "up.weight": "mlp.up.weight", "down.weight": "mlp.down.weight",
               "router.weight": "router.proj.weight", "router.bias": "router.proj.bias",
               "pred_in.weight": "predictor.in.weight", "pred_in.bias": "predictor.in.bias",
               "pred_out.weight": "predictor.out.weight", "pred_out.bias": "predictor.out.bias"}
    return f"blocks.{parts[1]}.{renamed.get(rest, rest)}"


def is_predictor(name):
    return ".pred_in." in name or ".pred_out." in name


# --- safetensors, float32 only: 8-byte little-endian header length, JSON header, data ---

def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        if h["dtype"] != "F32":
            sys.exit(f"torch_training_twin: {path}: {name} is {h['dtype']}, expected F32")
        a, b = h["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).reshape(h["shape"])
    return out


# --- modtrain's data order (train/data/permutation.cpp, train/data/loader.cpp) ---

def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class Permutation:
    """A balanced Feistel network on 2 * half_bits bits, six rounds, cycle-walked into [0, n)."""

    def __init__(self, n, key):
        self.n, self.key, self.half = n, mix(key & MASK64), 1
        while self.half < 32 and (1 << (2 * self.half)) < n:
            self.half += 1

    def _encrypt(self, x):
        mask = (1 << self.half) - 1
        left, right = x >> self.half, x & mask
        for r in range(6):
            f = mix((self.key + r * 0x9E3779B97F4A7C15 + right) & MASK64) & mask
            left, right = right, left ^ f
        return (left << self.half) | right

    def __call__(self, i):
        y = self._encrypt(i)
        while y >= self.n:
            y = self._encrypt(y)
        return y


def read_shard(path):
    """A MODTRAIN shard (docs/data.md): 32-byte header 'MODTOKS1', version, width, vocab,
    reserved (u32 each), token count (u64); then the tokens, 2 or 4 bytes each."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:8] != b"MODTOKS1":
        sys.exit(f"torch_training_twin: {path}: not a MODTRAIN shard")
    version, width, _vocab, _reserved, count = struct.unpack("<IIIIQ", raw[8:32])
    dtype = {2: torch.int16, 4: torch.int32}[width]
    t = torch.frombuffer(bytearray(raw[32:32 + count * width]), dtype=dtype).to(torch.int64)
    return t & 0xFFFF if width == 2 else t


class Loader:
    """WindowLoader for one process: batch b, row r is window Permutation(windows, seed *
    0x9E3779B97F4A7C15 ^ epoch)((b mod batches_per_epoch) * batch + r)."""

    def __init__(self, data_dir, seq_len, batch, seed):
        self.shards = [read_shard(p) for p in sorted(glob.glob(os.path.join(data_dir, "train_*.bin")))]
        self.per_shard = [(len(s) - 1) // seq_len for s in self.shards]
        self.windows = sum(self.per_shard)
        self.seq_len, self.batch, self.seed = seq_len, batch, seed
        self.per_epoch = self.windows // batch
        self.drawn = 0

    def _window(self, w):
        for s, here in zip(self.shards, self.per_shard):
            if w < here:
                t = s[w * self.seq_len: w * self.seq_len + self.seq_len + 1]
                return t[:-1], t[1:]
            w -= here
        raise IndexError(w)

    def next(self):
        b = self.drawn
        self.drawn += 1
        epoch, at = b // self.per_epoch, (b % self.per_epoch) * self.batch
        order = Permutation(self.windows, ((self.seed * 0x9E3779B97F4A7C15) & MASK64) ^ epoch)
        rows = [self._window(order(at + r)) for r in range(self.batch)]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


# --- the schedule (train/lr_schedule.cpp, docs/training.md) ---

def lr_factor(cfg):
    lr, min_lr = cfg["optimizer.lr"], cfg["optimizer.min_lr"]
    w, t = cfg["optimizer.warmup_steps"], cfg["train.steps"]

    def factor(s):
        if s < w:
            return (s + 1) / w
        progress = min(1.0, (s - w) / max(1, t - w))
        return (min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))) / lr
    return factor


class Twin(ref.Transformer):
    """The reference model, recording how close each routed block's top-C came to a tie: the
    smallest gap between the C-th and (C+1)-th router score of any sequence, over the sequence's
    largest |score|. Float32 rounding (other summation orders) can swap two tokens whose scores
    are that close, a discontinuity no tolerance on the loss covers."""

    def routed_block(self, blk, x):
        with torch.no_grad():
            r = blk.router(x).squeeze(-1)
            top = torch.topk(r, min(self.capacity + 1, r.shape[1]), dim=1).values
            if top.shape[1] > self.capacity:
                gap = (top[:, self.capacity - 1] - top[:, self.capacity]) / r.abs().amax(dim=1)
                self.tie_margin = min(self.tie_margin, gap.min().item())
        return super().routed_block(blk, x)


def build(cfg):
    torch.manual_seed(cfg["train.seed"])
    model = Twin(cfg, ref.sdpa_builtin)
    model.tie_margin = float("inf")
    return model


def load_cfg(path, sets):
    ref.DEFAULTS.update({k: v for k, v in EXTRA_DEFAULTS.items() if k not in ref.DEFAULTS})
    return ref.load_config(path, sets)


def train(cfg, init, data_dir):
    model = build(cfg)
    weights = read_safetensors(init)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[modtrain_name(name)])
    decay, no_decay, lm, pred = [], [], [], []
    for name, p in model.named_parameters():
        # MATRICES (docs/training.md): every weight matrix, routers and predictors included.
        (decay if p.dim() == 2 and not name.startswith("embed.") else no_decay).append(p)
        (pred if is_predictor(name) else lm).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["optimizer.weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg["optimizer.lr"], betas=(cfg["optimizer.beta1"], cfg["optimizer.beta2"]),
                            eps=cfg["optimizer.eps"], foreach=False)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor(cfg))
    loader = Loader(data_dir, cfg["model.seq_len"], cfg["train.batch_size"], cfg["train.seed"])
    accum = cfg["train.grad_accum"]
    losses = []
    for _ in range(cfg["train.steps"]):
        model.tie_margin = float("inf")
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for _ in range(accum):
            tokens, targets = loader.next()
            lm_loss, loss = model(tokens, targets)
            (loss / accum).backward()
            step_loss += lm_loss.item() / accum
        torch.nn.utils.clip_grad_norm_(lm, cfg["optimizer.grad_clip"])
        if pred:
            torch.nn.utils.clip_grad_norm_(pred, cfg["model.mod.causal.predictor_grad_clip"])
        opt.step()
        sched.step()
        losses.append((step_loss, model.tie_margin))
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("write-init", "train"))
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_cfg(args.paths[0], args.set)
    if args.what == "write-init":
        model = build(cfg)
        write_safetensors(args.paths[1], {modtrain_name(n): p for n, p in model.named_parameters()})
        return
    config, init, data_dir, out = args.paths
    losses = train(cfg, init, data_dir)
    with open(out, "w") as f:
        f.write("".join(f"{loss:.9g} {margin:.3g}\n" for loss, margin in losses))


if __name__ == "__main__":
    main()
