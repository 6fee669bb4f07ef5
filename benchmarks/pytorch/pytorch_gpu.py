#!/usr/bin/env python3
"""pytorch_gpu: the PyTorch twin of modtrain's model (benchmarks/pytorch/pytorch_reference.py) trained on
one GPU in bf16, for the figures docs/gpu.md and docs/memory.md set beside modtrain's: step time,
tokens/s and peak allocated memory, dense and MoD, with and without torch.utils.checkpoint around
every block (FULL recompute's counterpart; a routed block checkpoints its delta on the gathered
rows, as modtrain's region does).

PyTorch's set-up for a GPU: bf16 autocast with f32 master weights (modtrain's BF16), fused
scaled-dot-product attention (flash on the causal dense blocks), fused AdamW, RoPE tables in bf16,
and optionally torch.compile (--compile; it costs a minute a model). The peak is
torch.cuda.max_memory_allocated over the timed steps: parameters, gradients, AdamW state and
activations, what modtrain's peak_memory_mb counts.

--profile N: instead of timing, run torch.profiler over N steps of the dense and MoD models (eager,
and compiled with --compile) and print their kernels by device time, the counterpart of modtrain's
train.profile_steps table.

Usage (on a GPU machine, from the repository root):
  python3 benchmarks/pytorch/pytorch_gpu.py --config configs/recipes/gpt2_small_mod.textproto \
      --set train.batch_size=64 --steps 10
"""
import argparse
import statistics
import sys
import time

import torch
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import pytorch_reference as ref  # noqa: E402


class CheckpointedTransformer(ref.Transformer):
    """ref.Transformer with each block's delta rerun in backward (torch.utils.checkpoint)."""

    def __init__(self, cfg, attn, recompute):
        super().__init__(cfg, attn)
        self.recompute = recompute
        for blk in self.blocks:
            plain = blk.delta
            if recompute:
                blk.delta = (lambda *a, _f=plain: checkpoint(_f, *a, use_reentrant=False))


def make_step(cfg, recompute, compiled):
    torch.manual_seed(cfg["train.seed"])
    model = CheckpointedTransformer(cfg, ref.sdpa_builtin, recompute).cuda()
    model.cos, model.sin = model.cos.bfloat16(), model.sin.bfloat16()
    fwd = torch.compile(model) if compiled else model
    opt = ref.make_optimizer(model, cfg, "fused")
    b, t, v = cfg["train.batch_size"], cfg["model.seq_len"], cfg["model.vocab_size"]
    tokens = torch.randint(0, v, (b, t), device="cuda")
    targets = torch.randint(0, v, (b, t), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lm, loss = fwd(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["optimizer.grad_clip"])
        opt.step()
        return lm

    return step, cfg["train.batch_size"] * cfg["model.seq_len"]


def run(cfg, recompute, compiled, steps, warmup):
    step, tokens_per_step = make_step(cfg, recompute, compiled)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        lm = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated()
    med = statistics.median(times)
    return lm.item(), med, tokens_per_step / med, peak


def profile(name, cfg, compiled, steps, warmup):
    """Kernels by device time over `steps` steps, per step, as torch.profiler sums them."""
    from torch.profiler import ProfilerActivity
    step, _ = make_step(cfg, False, compiled)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    events = prof.key_averages()
    busy = sum(e.self_device_time_total for e in events) / 1e3 / steps
    print(f"PyTorch profile {name}: kernels {busy:.2f} ms a step, wall {1e3 * wall:.2f} ms a step "
          f"(profiler on)")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
        if e.self_device_time_total <= 0:
            continue
        print(f"  {100 * e.self_device_time_total / 1e3 / steps / busy:5.1f}% "
              f"{e.self_device_time_total / 1e3 / steps:9.3f} ms {e.count / steps:6.0f}  {e.key[:100]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/recipes/gpt2_small_mod.textproto")
    ap.add_argument("--set", action="append", default=[], help="override: path.to.field=value")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile without recompute")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print the kernels of N steps of each model instead of timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pytorch_gpu: no CUDA device")
    mod_cfg = ref.load_config(args.config, args.set)
    dense_cfg = dict(mod_cfg, **{"model.mod.enabled": False})
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}; d_model {mod_cfg['model.d_model']}, "
          f"{mod_cfg['model.n_layers']} layers, seq {mod_cfg['model.seq_len']}, batch {mod_cfg['train.batch_size']}, "
          f"vocab {mod_cfg['model.vocab_size']}; bf16 autocast, SDPA, fused AdamW")
    if args.profile:
        for label, cfg in (("dense", dense_cfg), ("MoD", mod_cfg)):
            for compiled in (False, True) if args.compile else (False,):
                profile(label + (" compiled" if compiled else ""), cfg, compiled, args.profile,
                        args.warmup)
                torch.cuda.empty_cache()
        return
    variants = [(l, c, r, False) for l, c in (("dense", dense_cfg), ("MoD", mod_cfg)) for r in (False, True)]
    if args.compile:
        variants += [(l, c, False, True) for l, c in (("dense", dense_cfg), ("MoD", mod_cfg))]
    for label, cfg, recompute, compiled in variants:
        name = f"{label}{' checkpoint' if recompute else ''}{' compiled' if compiled else ''}"
        try:
            lm, med, tok_s, peak = run(cfg, recompute, compiled, args.steps, args.warmup)
        except Exception as e:  # noqa: BLE001 -- one variant failing must not hide the others
            print(f"  {name:26s} failed: {type(e).__name__}: {str(e)[:300]}")
            continue
        print(f"  {name:26s} loss {lm:.3f} | step {1e3 * med:7.1f} ms | {tok_s:9.0f} tok/s | "
              f"peak {peak / 2**30:6.2f} GiB")
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
