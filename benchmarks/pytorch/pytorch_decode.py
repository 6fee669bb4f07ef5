#!/usr/bin/env python3
"""pytorch_decode: PyTorch's KV-cache decoding of modtrain's model (the twin in
benchmarks/pytorch/pytorch_reference.py), dense and MoD, B sequences at once, on the CPU or one
GPU: the peer of train_bench's sampling half (benchmarks/compare_sampling.sh, CPU, batch 1) and of
`modtrain sample --device CUDA` (scripts/gpu_run.sh bench, batch 1 and 64).

Decoding as modtrain's sampler does it: one token a step for every sequence; every block keeps a
KV cache per sequence; a routed block asks its predictor (the causal decision, logit > 0) per
sequence, and an admitted sequence writes its cache slot, attends over the tokens that block
admitted before (at their true positions) and takes x + r * delta; the others pass unchanged, so
each sequence's caches grow raggedly. The twin builds its own random-init model (it reads no
modtrain checkpoint); as in train_bench, the predictors get output biases that admit
`model.mod.capacity` of sampled tokens (two calibration rounds of 8 sequences). Temperature 1, no
top-k or top-p: the draw is on the device (argmax of p / Exp(1) noise, the categorical draw).

Set-ups, PyTorch's best searched (warm-up, tracing and graph recording untimed):
  eager, sliced cache     attention over the filled slots; a routed block no sequence enters is
                          skipped (a host read of the decisions); at batch 1 an admitted token
                          runs the block alone, at batch B every sequence runs it, masked
  compiled, static cache  one shape for every step: attention over all T slots under a length
                          mask, every routed block computed for every sequence with the update
                          and the cache length masked by the decision (modtrain's GPU path);
                          torch.compile, with mode="reduce-overhead" (CUDA graphs) on a GPU
Precision (--dtype): f32 by default, as `modtrain sample --device CUDA` reads a checkpoint's f32
master weights and runs f32 GEMMs without TF32 (docs/gpu.md, "The floor a batch-1 step cannot
beat"); bf16 holds the weights and caches in bf16.

Prints one line per model and set-up, then
  RESULT pytorch_sample_tokens_per_s dense X mod Y batch B device D dtype T
with each model's best set-up (new tokens of all sequences over the timed generations' time; "n/a"
for a model left out by --models).

--self-check: greedy decoding, float64 by default, of a random model with model.init_std 0.3 (its
greedy texts vary; predictors calibrated on them), checks that batch B decodes each sequence as
batch 1 does: B copies of one prompt give B identical sequences equal to the batch-1 one, and B
different prompts give each its own batch-1 sequence and cache lengths, in every set-up; prints
"self-check: N passed, M failed" and exits 1 on a failure.

Usage: python3 benchmarks/pytorch/pytorch_decode.py [--config FILE] [--set f=v ...] [--threads 2]
         [--device cpu|cuda] [--batch B] [--new-tokens N] [--dtype f32|bf16|f64] [--models dense,mod]
       python3 benchmarks/pytorch/pytorch_decode.py --self-check [--device cuda] [--batch 4]
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import pytorch_reference as ref  # noqa: E402

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f64": torch.float64}


class Decoder:
    """KV-cache decoding of a ref.Transformer, B sequences at once. Shapes: B batch, H heads,
    T cache slots, Dh head width, D model width; caches [blocks, B, H, T, Dh] allocated once."""

    def __init__(self, model, batch, t_max, static, compiled=False, temperature=1.0, record=False):
        self.m, self.b, self.t_max, self.static = model, batch, t_max, static
        self.temperature, self.record = temperature, record
        cfg = model.cfg
        self.heads = cfg["model.n_heads"]
        self.hd = cfg["model.d_model"] // self.heads
        self.gate_sigmoid = cfg["model.mod.router.gate"] == "SIGMOID"
        w = model.embed.weight
        self.device, self.cuda = w.device, w.device.type == "cuda"
        shape = (len(model.blocks), batch, self.heads, t_max, self.hd)
        self.k = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.v = torch.zeros(shape, device=w.device, dtype=w.dtype)
        self.len = torch.zeros(len(model.blocks), batch, device=w.device, dtype=torch.long)
        self.slots = torch.arange(t_max, device=w.device)  # and the positions, as tensors
        self.hlen = [0] * len(model.blocks)  # eager batch 1: the lengths on the host
        self.pred_logits = [[] for _ in model.blocks]
        self.compiled = compiled
        self.step = self._step
        if compiled:
            if self.cuda and hasattr(torch, "_dynamo"):  # the graph writes these in place
                for t in (self.k, self.v, self.len):
                    torch._dynamo.mark_static_address(t)
            mode = "reduce-overhead" if self.cuda else None
            self.step = torch.compile(self._step, mode=mode, dynamic=False)

    def reset(self):
        self.len.zero_()  # in place: a CUDA graph keeps reading these addresses
        self.hlen = [0] * len(self.m.blocks)
        self.pred_logits = [[] for _ in self.m.blocks]

    def _rope_at(self, pos):
        if isinstance(pos, int):
            return self.m.cos[pos].view(1, 1, 1, -1), self.m.sin[pos].view(1, 1, 1, -1)
        p = pos.view(1)
        return (self.m.cos.index_select(0, p).view(1, 1, 1, -1),
                self.m.sin.index_select(0, p).view(1, 1, 1, -1))

    def _delta(self, i, x, pos, admit):
        """Block i's delta for one token a sequence, x [B,1,D] at position pos; writes its k and v
        to each sequence's next free slot and advances the lengths where admit [B] (None: all)."""
        blk, b, h, hd = self.m.blocks[i], self.b, self.heads, self.hd
        n = blk.norm1(x)
        cos, sin = self._rope_at(pos)
        q = ref.rope(blk.wq(n).view(b, 1, h, hd), cos, sin).transpose(1, 2)  # [B,H,1,Dh]
        k = ref.rope(blk.wk(n).view(b, 1, h, hd), cos, sin).transpose(1, 2)
        v = blk.wv(n).view(b, 1, h, hd).transpose(1, 2)
        if not self.static and b == 1:  # the filled slots alone; the caller skipped a turned-away token
            a = self.hlen[i]
            self.k[i, :, :, a] = k[:, :, 0]
            self.v[i, :, :, a] = v[:, :, 0]
            o = F.scaled_dot_product_attention(q, self.k[i, :, :, : a + 1], self.v[i, :, :, : a + 1])
            self.hlen[i] += 1
        else:
            # Every sequence writes its next free slot len[b]: a turned-away one's write is
            # overwritten by its next admitted token (its length does not move), so this is the
            # masked cache write without a select.
            at = self.len[i]  # [B]
            slot = at.view(b, 1, 1, 1).expand(b, h, 1, hd)
            self.k[i].scatter_(2, slot, k)
            self.v[i].scatter_(2, slot, v)
            t = self.t_max if self.static else pos + 1  # eager: no length exceeds pos + 1
            mask = self.slots[:t].view(1, 1, 1, t) <= at.view(b, 1, 1, 1)  # [B,1,1,T]
            o = F.scaled_dot_product_attention(q, self.k[i, :, :, :t], self.v[i, :, :, :t],
                                               attn_mask=mask)
            at += 1 if admit is None else admit.long()
        a_out = blk.wo(o.transpose(1, 2).reshape(b, 1, -1))
        return a_out + blk.down(F.gelu(blk.up(blk.norm2(x + a_out)), approximate="tanh"))

    def _step(self, token, pos):
        """The next token of every sequence after token [B] at position pos."""
        b = self.b
        x = self.m.embed(token).view(b, 1, -1)
        for i, blk in enumerate(self.m.blocks):
            if not blk.routed:
                x = x + self._delta(i, x, pos, None)
                continue
            p = blk.pred_out(F.silu(blk.pred_in(x))).view(b)  # the decision logits [B]
            if self.record:
                self.pred_logits[i].append(p)
            admit = p > 0
            if not self.static and not bool(admit.any()):
                continue  # nobody enters: no compute, no cache entry
            r = blk.router(x)  # [B,1,1]
            g = torch.sigmoid(r) if self.gate_sigmoid else r
            if not self.static and b == 1:
                x = x + g * self._delta(i, x, pos, None)
            else:
                x = torch.where(admit.view(b, 1, 1), x + g * self._delta(i, x, pos, admit), x)
        logits = F.linear(self.m.final_norm(x), self.m.embed.weight).view(b, -1)
        if self.temperature == 0:
            return logits.argmax(-1)
        probs = torch.softmax(logits.float() / self.temperature, -1)
        return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)  # a categorical draw

    def generate(self, first, n):
        """n new tokens after first (an int: B copies; or a LongTensor [B]); returns [B, n + 1]."""
        self.reset()
        out = torch.empty(n + 1, self.b, dtype=torch.long, device=self.device)
        out[0] = first if isinstance(first, int) else first.to(self.device)
        mark = self.compiled and self.cuda and hasattr(torch, "compiler")
        for pos in range(n):
            if mark:  # the last step's outputs are no longer read: its graph may be replayed
                torch.compiler.cudagraph_mark_step_begin()
            # A static step takes pos as a tensor: one graph for every position.
            out[pos + 1] = self.step(out[pos], self.slots[pos] if self.static else pos)
        return out.t()

    def admitted(self):
        """Tokens each block admitted, summed over the sequences, for the last generation."""
        return list(self.hlen) if not self.static and self.b == 1 else self.len.sum(1).tolist()


def calibrate(model, capacity, n, firsts, rounds=2, temperature=1.0):
    """Output biases of the predictors so that `capacity` of sampled tokens are admitted: each
    round decodes one sequence per first token in firsts [S] as one batch and moves the
    (1 - capacity) quantile of their decision logits just below 0."""
    dec = Decoder(model, len(firsts), n, static=False, temperature=temperature, record=True)
    routed = [i for i, b in enumerate(model.blocks) if b.routed]
    for _ in range(rounds):
        dec.generate(firsts, n)
        for i in routed:
            vals = torch.cat(dec.pred_logits[i]).double().sort().values
            lo = vals[min(len(vals) - 1, int(len(vals) * (1 - capacity)))]
            above = vals[vals > lo]  # 0 goes midway to the next value: no logit sits on it
            cut = float(lo if len(above) == 0 else (lo + above[0]) / 2)
            model.blocks[i].pred_out.bias -= cut


def sync(dec):
    if dec.cuda:
        torch.cuda.synchronize()


def timed(dec, n, reps, vocab):
    """Tokens/s over `reps` generations of n new tokens, B copies of a random first token each
    (modtrain sample's copies of one prompt), and each routed block's admitted fraction."""
    gen = torch.Generator().manual_seed(7)
    dec.generate(0, min(8, n))  # warm-up: a compiled step traces, compiles and records its graph
    dec.generate(1, min(8, n))
    sync(dec)
    routed = [i for i, b in enumerate(dec.m.blocks) if b.routed]
    admitted = [0] * len(routed)
    tokens, seconds = 0, 0.0
    for _ in range(reps):
        first = int(torch.randint(0, vocab, (1,), generator=gen))
        sync(dec)
        t0 = time.perf_counter()
        dec.generate(first, n)
        sync(dec)
        seconds += time.perf_counter() - t0
        tokens += dec.b * n
        counts = dec.admitted()
        admitted = [a + counts[i] for a, i in zip(admitted, routed)]
    return tokens / seconds, [a / tokens for a in admitted]


def no_autograd(compiled, device):
    """inference_mode (the least work a small op); no_grad around a CUDA graph, which keeps
    tensors that later steps write in place (inference tensors would refuse that outside it)."""
    return torch.no_grad() if compiled and device == "cuda" else torch.inference_mode()


def build(cfg, device, dtype):
    torch.manual_seed(cfg["train.seed"])
    model = ref.Transformer(cfg, ref.sdpa_builtin).eval().to(device=device, dtype=dtype)
    return model.requires_grad_(False)  # decoding only (calibration moves the biases in place)


def same_as_batch_1(dec, first, want, routed):
    """Whether sequence s of dec's generation from first has the tokens and, where each sequence
    has its own, the routed blocks' cache lengths of want[s] = (batch-1 tokens, admitted)."""
    n = dec.t_max
    got = dec.generate(first, n).cpu()
    ok = all(torch.equal(got[s], want[s][0]) for s in range(dec.b))
    if dec.static or dec.b > 1:
        lens = dec.len.cpu()
        ok = ok and all(lens[i, s].item() == want[s][1][i] for s in range(dec.b) for i in routed)
    return ok


def self_check(models, args, device, dtype):
    """Greedy decoding: batch B against batch 1, sequence by sequence, in every set-up."""
    n, b = args.tokens, max(2, args.batch)
    failed = passed = 0
    for label, cfg in models:
        # At init_std 0.02 a random model's greedy text repeats its first token and every decision
        # logit sits within 1e-3 of 0; at 0.3 the texts vary and the decisions are clear-cut.
        if not any(s.startswith("model.init_std=") for s in args.set):
            cfg = dict(cfg, **{"model.init_std": 0.3})
        model = build(cfg, device, dtype)
        vocab = cfg["model.vocab_size"]
        firsts = torch.randint(0, vocab, (b,), generator=torch.Generator().manual_seed(3))
        with torch.inference_mode():
            if cfg["model.mod.enabled"]:  # on these greedy texts, so that they see both decisions
                calibrate(model, cfg["model.mod.capacity"], n, firsts, temperature=0)
            refs = []  # batch 1, eager: the reference, one prompt at a time
            for f in firsts.tolist():
                dec = Decoder(model, 1, n, static=False, temperature=0)
                refs.append((dec.generate(f, n)[0].cpu(), dec.admitted()))
        routed = [i for i, blk in enumerate(model.blocks) if blk.routed]
        adm = [refs[0][1][i] for i in routed]
        print(f"  {label}: batch-1 reference of {n} tokens, admitted per routed block {adm}")
        if routed and not any(0 < a < n for a in adm):
            print(f"  {label}: the reference admits all or none of its tokens: the check would see "
                  f"one decision only  FAILED")
            failed += 1
        setups = [("eager", False, False), ("static", True, False)]
        if not args.no_compile:
            setups.append(("compiled, static", True, True))
        for name, static, compiled in setups:
            for batch in (1, b):
                try:
                    with no_autograd(compiled, device):
                        dec = Decoder(model, batch, n, static, compiled, temperature=0)
                        cases = [("copies of one prompt", int(firsts[0]), [refs[0]] * batch)]
                        if batch > 1:
                            cases.append(("different prompts", firsts, refs))
                        results = [(what, same_as_batch_1(dec, first, want, routed))
                                   for what, first, want in cases]
                except Exception as e:  # noqa: BLE001 -- report the set-up, check the others
                    print(f"  {label:5s} {name:16s} batch {batch:2d} failed: {type(e).__name__}: "
                          f"{str(e)[:200]}")
                    failed += 1
                    continue
                for what, ok in results:
                    print(f"  {label:5s} {name:16s} batch {batch:2d}, {what:20s} "
                          f"{'ok' if ok else 'MISMATCH'}")
                    passed, failed = passed + ok, failed + (not ok)
    print(f"self-check: {passed} passed, {failed} failed")
    return failed == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/recipes/tiny_mod.textproto")
    ap.add_argument("--set", action="append", default=[], help="override: path.to.field=value")
    ap.add_argument("--threads", type=int, default=2, help="intra-op CPU threads")
    ap.add_argument("--reps", type=int, default=8, help="timed generations per model and set-up")
    ap.add_argument("--new-tokens", "--tokens", dest="tokens", type=int, default=0,
                    help="new tokens a sequence, e.g. 500 (0: seq_len - 1)")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together, e.g. 64")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                    help="weights and caches (default f32; f64 with --self-check)")
    ap.add_argument("--models", default="dense,mod",
                    help="dense (the config with model.mod.enabled false), mod, or both")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled set-up")
    ap.add_argument("--self-check", action="store_true",
                    help="check batch-B greedy decoding against batch 1 instead of timing")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("pytorch_decode: no CUDA device")
    dtype_name = args.dtype or ("f64" if args.self_check else "f32")
    dtype = DTYPES[dtype_name]
    mod_cfg = ref.load_config(args.config, args.set)
    wanted = set(args.models.lower().split(","))
    if not wanted or wanted - {"dense", "mod"}:
        sys.exit(f"pytorch_decode: --models {args.models}: name dense, mod or both")
    if "mod" in wanted and not mod_cfg["model.mod.enabled"]:
        sys.exit(f"pytorch_decode: {args.config} has model.mod.enabled false: use --models dense")
    models = [(label, cfg) for label, key, cfg in (
        ("dense", "dense", dict(mod_cfg, **{"model.mod.enabled": False})), ("MoD", "mod", mod_cfg))
        if key in wanted]
    if args.tokens == 0:
        args.tokens = 32 if args.self_check else mod_cfg["model.seq_len"] - 1
    n, vocab = args.tokens, mod_cfg["model.vocab_size"]
    if n >= mod_cfg["model.seq_len"]:
        sys.exit(f"pytorch_decode: {n} new tokens leave no room in model.seq_len {mod_cfg['model.seq_len']}")
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{args.threads} threads"
    if args.self_check:
        print(f"PyTorch {torch.__version__}, {where}: self-check, greedy, {n} tokens, "
              f"batch {max(2, args.batch)} against batch 1, {dtype_name}")
        sys.exit(0 if self_check(models, args, args.device, dtype) else 1)
    print(f"PyTorch {torch.__version__}, {where}: decoding {n} tokens, batch {args.batch}, "
          f"KV cache, temperature 1, {dtype_name}, {args.reps} generations "
          f"a model and set-up")
    best = {}
    for label, cfg in models:
        model = build(cfg, args.device, dtype)
        weight_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
        if cfg["model.mod.enabled"]:  # 8 sampled texts, as train_bench
            with torch.inference_mode():
                calibrate(model, cfg["model.mod.capacity"], n,
                          torch.randint(0, vocab, (8,), generator=torch.Generator().manual_seed(1000)))
        for static in (False, True) if not args.no_compile else (False,):
            name = "compiled, static cache" if static else "eager, sliced cache"
            try:
                with no_autograd(static, args.device):
                    dec = Decoder(model, args.batch, n, static, compiled=static)
                    tok_s, frac = timed(dec, n, args.reps, vocab)
            except Exception as e:  # noqa: BLE001 -- a set-up failing must not hide the others
                print(f"  {label:5s} {name:24s} failed: {type(e).__name__}: {str(e)[:200]}",
                      flush=True)
                continue
            extra = (" | admitted " + " ".join(f"{100 * f:.1f}%" for f in frac)) if frac else ""
            # Napkin: a step reads every weight once (a lower bound on its bytes).
            gbs = weight_mb * tok_s / args.batch / 1e3
            print(f"  {label:5s} {name:24s} {tok_s:9.1f} tok/s | weights {weight_mb:.0f} MB a "
                  f"step: {gbs:.3g} GB/s{extra}", flush=True)
            best[label] = max(best.get(label, 0.0), tok_s)
    fig = {k: (f"{best[k]:.1f}" if k in best else "n/a") for k in ("dense", "MoD")}
    print(f"RESULT pytorch_sample_tokens_per_s dense {fig['dense']} mod {fig['MoD']} "
          f"batch {args.batch} device {args.device} dtype {dtype_name}")


if __name__ == "__main__":
    main()
