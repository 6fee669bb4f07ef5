#!/usr/bin/env python3
"""pytorch_decode: PyTorch's KV-cache decoding of modtrain's model (the twin in
benchmarks/pytorch/pytorch_reference.py), dense and MoD, batch 1, temperature 1: the peer of
train_bench's sampling half, for benchmarks/compare_sampling.sh.

Decoding as modtrain's sampler does it: one token at a time; every block keeps a KV cache; a
routed block asks its predictor (the causal decision) and, when admitted, runs attention over the
cache of the tokens it admitted before (at their true positions) and adds r * delta, else the
token skips it. As in train_bench, the predictors of the untrained model get output biases that
admit `model.mod.capacity` of the tokens (two calibration rounds on sampled text).

PyTorch's best set-up is searched: caches grown by slicing a preallocated buffer (eager), or one
static shape with a mask so that torch.compile traces a single graph (compiled); threads as
given. Prints one RESULT line: tokens/s of dense and MoD (total tokens over total time of the
timed generations).

Usage: python3 benchmarks/pytorch/pytorch_decode.py [--config FILE] [--set f=v ...] [--threads 2]
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import pytorch_reference as ref  # noqa: E402


class Decoder:
    """KV-cache decoding of a ref.Transformer, batch 1."""

    def __init__(self, model, static):
        self.m, self.static = model, static
        cfg = model.cfg
        self.t_max = cfg["model.seq_len"]
        self.heads = cfg["model.n_heads"]
        self.hd = cfg["model.d_model"] // self.heads
        self.gate_sigmoid = cfg["model.mod.router.gate"] == "SIGMOID"
        self.step = torch.compile(self._step, dynamic=False) if static else self._step

    def reset(self):
        shape = (len(self.m.blocks), 1, self.heads, self.t_max, self.hd)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.len = torch.zeros(len(self.m.blocks), dtype=torch.long)
        self.pred_logits = [[] for _ in self.m.blocks]

    def _attend(self, i, x, pos):
        """One block's delta for one token x [1,1,D] at position pos, its k and v cached."""
        blk, m = self.m.blocks[i], self.m
        n = blk.norm1(x)
        cos, sin = m.cos[pos].view(1, 1, 1, -1), m.sin[pos].view(1, 1, 1, -1)
        q = ref.rope(blk.wq(n).view(1, 1, self.heads, self.hd), cos, sin).transpose(1, 2)
        k = ref.rope(blk.wk(n).view(1, 1, self.heads, self.hd), cos, sin).transpose(1, 2)
        v = blk.wv(n).view(1, 1, self.heads, self.hd).transpose(1, 2)
        at = self.len[i]
        if self.static:  # one shape for every token: attend over the whole buffer, masked
            self.k[i].index_copy_(2, at.view(1), k)
            self.v[i].index_copy_(2, at.view(1), v)
            mask = (torch.arange(self.t_max) <= at).view(1, 1, 1, -1)
            o = F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask)
        else:
            a = int(at)
            self.k[i, :, :, a] = k[:, :, 0]
            self.v[i, :, :, a] = v[:, :, 0]
            o = F.scaled_dot_product_attention(q, self.k[i, :, :, : a + 1], self.v[i, :, :, : a + 1])
        self.len[i] += 1
        a_out = blk.wo(o.transpose(1, 2).reshape(1, 1, -1))
        return a_out + blk.down(F.gelu(blk.up(blk.norm2(x + a_out)), approximate="tanh"))

    def _step(self, token, pos):
        """Logits of the next token after `token` at position `pos`."""
        x = self.m.embed(token.view(1, 1))
        for i, blk in enumerate(self.m.blocks):
            if not blk.routed:
                x = x + self._attend(i, x, pos)
                continue
            p = blk.pred_out(F.silu(blk.pred_in(x))).view(())
            self.pred_logits[i].append(p)
            if p > 0:  # admitted: the causal decision
                r = blk.router(x)
                x = x + (torch.sigmoid(r) if self.gate_sigmoid else r) * self._attend(i, x, pos)
        return F.linear(self.m.final_norm(x), self.m.embed.weight).view(-1)

    def generate(self, first, n, gen):
        self.reset()
        out, token = [first], torch.tensor(first)
        for pos in range(n):
            logits = self.step(token, torch.tensor(pos))
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen).view(())
            out.append(int(token))
        return out


def calibrate(dec, capacity, n, vocab, rounds=2, texts=8):
    """Output biases of the predictors so that `capacity` of sampled tokens are admitted."""
    gen = torch.Generator().manual_seed(1000)
    routed = [i for i, b in enumerate(dec.m.blocks) if b.routed]
    for _ in range(rounds):
        logits = {i: [] for i in routed}
        for t in range(texts):
            dec.generate(int(torch.randint(0, vocab, (1,), generator=gen)), n, gen)
            for i in routed:
                logits[i] += [float(v) for v in dec.pred_logits[i]]
        for i in routed:
            vals = sorted(logits[i])
            cut = vals[min(len(vals) - 1, int(len(vals) * (1 - capacity)))]
            dec.m.blocks[i].pred_out.bias -= cut  # the (1 - capacity) quantile moves to 0


def timed(dec, n, reps, vocab):
    gen = torch.Generator().manual_seed(7)
    dec.generate(0, 8, gen)  # warm-up (a compiled step traces here)
    admitted = {i: 0 for i, b in enumerate(dec.m.blocks) if b.routed}
    tokens, seconds = 0, 0.0
    for rep in range(reps):
        first = int(torch.randint(0, vocab, (1,), generator=gen))
        t0 = time.perf_counter()
        dec.generate(first, n, gen)
        seconds += time.perf_counter() - t0
        tokens += n
        for i in admitted:
            admitted[i] += int(dec.len[i])
    frac = [admitted[i] / tokens for i in admitted]
    return tokens / seconds, frac


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/recipes/tiny_mod.textproto")
    ap.add_argument("--set", action="append", default=[], help="override: path.to.field=value")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=8, help="timed generations per model")
    ap.add_argument("--tokens", type=int, default=0, help="tokens a generation (0: seq_len - 1)")
    ap.add_argument("--no-compile", action="store_true", help="skip the compiled set-up")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mod_cfg = ref.load_config(args.config, args.set)
    dense_cfg = dict(mod_cfg, **{"model.mod.enabled": False})
    n = args.tokens or mod_cfg["model.seq_len"] - 1
    vocab = mod_cfg["model.vocab_size"]
    print(f"PyTorch {torch.__version__}, {args.threads} threads: decoding {n} tokens, batch 1, "
          f"KV cache, temperature 1, {args.reps} generations a model")
    best = {}
    for label, cfg in (("dense", dense_cfg), ("MoD", mod_cfg)):
        torch.manual_seed(cfg["train.seed"])
        model = ref.Transformer(cfg, ref.sdpa_builtin).eval()
        with torch.inference_mode():
            for static in (False, True) if not args.no_compile else (False,):
                name = "compiled, static cache" if static else "eager, sliced cache"
                try:
                    dec = Decoder(model, static)
                    if label == "MoD" and not static:
                        calibrate(dec, mod_cfg["model.mod.capacity"], n, vocab)
                    tok_s, frac = timed(dec, n, args.reps, vocab)
                except Exception as e:  # noqa: BLE001 -- a set-up failing must not hide the others
                    print(f"  {label:5s} {name:24s} failed: {type(e).__name__}: {str(e)[:200]}")
                    continue
                extra = (" | admitted " + " ".join(f"{100 * f:.1f}%" for f in frac)) if frac else ""
                print(f"  {label:5s} {name:24s} {tok_s:8.1f} tok/s{extra}", flush=True)
                best[label] = max(best.get(label, 0.0), tok_s)
    print(f"RESULT pytorch_sample_tokens_per_s dense {best.get('dense', 0):.1f} "
          f"mod {best.get('MoD', 0):.1f}")


if __name__ == "__main__":
    main()
