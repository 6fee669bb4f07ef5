# modtrain's transformer in plain PyTorch, for transformers' AutoModelForCausalLM with
# trust_remote_code=True (docs/hf.md); written by `modtrain export --format hf` for the models
# LlamaForCausalLM cannot express: a GELU MLP, LayerNorm, Mixture-of-Depths, mixture-of-experts
# MLPs and both MoDEs (integrated: a no-op expert; staged: MoE inside routed blocks). Names are
# modtrain's own (embed.weight, blocks.N.attn.wq.weight, ...), so model.safetensors is copied
# as it is. Invariant: the forward is model/transformer.cpp's, to float tolerance:
#   pre-norm blocks; RoPE on pairs (i, i + Dh/2), angles pos * theta^(-2i/Dh) in float64;
#   softmax(q k^T / sqrt(Dh)), causal by original position; logits = final_norm(x) W^T.
#   A routed block (MoD): r = router(x) per token; under top-C routing the C = max(1,
#   round(capacity * T)) highest r of each sequence (ties to the lower position) are gathered in
#   position order, and x_i += g(r_i) * (a_i + m_i) for them, a the block's attention and m its
#   MLP output; under causal routing a token enters iff its predictor (or router, for aux_bce)
#   logit is > 0, which depends on nothing after it.
#   An MoE MLP (model/moe.h): p = softmax(router(h)) over E experts (+1 no-op). Training routing
#   ("top_c"): expert choice, each real expert takes the k highest-p tokens of the sequence left
#   after the no-op expert took its own; or token choice, each token its top_k experts, first
#   choices placed in position order before second ones, into K slots per expert. Causal: each
#   token alone takes its top pick (top_k under token choice) among E', the no-op adding nothing.
#   A token's output is sum over the experts that took it of p_e * expert_e(h), in expert order.
# generate() routes causally with a KV cache of its own: a routed block keeps K/V for the tokens
# it admitted only, as modtrain sample does.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from .configuration_modtrain import ModtrainConfig
except ImportError:  # loaded as a plain module, not as transformers' dynamic module
    from configuration_modtrain import ModtrainConfig


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(config):
    if config.norm == "layer":
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
    return RMSNorm(config.hidden_size, config.norm_eps)


def rope(x, pos, theta):
    """x [B, T, H, Dh], pos [B, T] -> x with pairs (i, i + Dh/2) rotated by pos * theta^(-2i/Dh)."""
    dh = x.shape[-1]
    half = dh // 2
    inv_freq = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / dh)
    angle = pos.to(torch.float64)[..., None] * inv_freq  # [B, T, half]
    cos = angle.cos().to(x.dtype)[:, :, None, :]
    sin = angle.sin().to(x.dtype)[:, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.theta = config.rope_theta
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)

    def forward(self, x, pos, cache=None):
        """cache: one sequence's {"k", "v", "pos"} of this block, extended by x's tokens."""
        b, t, d = x.shape
        dh = d // self.heads
        q = rope(self.wq(x).view(b, t, self.heads, dh), pos, self.theta).transpose(1, 2)
        k = rope(self.wk(x).view(b, t, self.heads, dh), pos, self.theta).transpose(1, 2)
        v = self.wv(x).view(b, t, self.heads, dh).transpose(1, 2)
        key_pos = pos
        if cache is not None:
            if cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
                key_pos = torch.cat([cache["pos"], pos], dim=1)
            cache.update(k=k, v=v, pos=key_pos)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(dh)  # [B, H, T, S]
        allowed = pos[:, None, :, None] >= key_pos[:, None, None, :]  # key position <= query's
        scores = scores.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        return self.wo(a.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, ff = config.hidden_size, config.intermediate_size
        self.swiglu = config.mlp == "swiglu"
        self.up = nn.Linear(d, ff, bias=False)
        if self.swiglu:
            self.gate = nn.Linear(d, ff, bias=False)
        self.down = nn.Linear(ff, d, bias=False)

    def forward(self, x):
        if self.swiglu:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def llround(v):
    """C's llround for v >= 0 (half away from zero), as modtrain's capacities round; exact, where
    floor(v + 0.5) would round 0.49999999999999994 up."""
    r = math.floor(v)
    return int(r + 1 if v - r >= 0.5 else r)


class Experts(nn.Module):
    """E expert MLPs as modtrain stores them: up, gate [E, F, D], down [E, D, F]."""

    def __init__(self, config):
        super().__init__()
        e, d = config.moe_n_experts, config.hidden_size
        f = config.moe_d_expert or config.intermediate_size
        self.swiglu = config.mlp == "swiglu"
        self.up = nn.Parameter(torch.empty(e, f, d))
        if self.swiglu:
            self.gate = nn.Parameter(torch.empty(e, f, d))
        self.down = nn.Parameter(torch.empty(e, d, f))

    def one(self, e, x):
        """Expert e on the rows x [N, D]."""
        h = F.linear(x, self.up[e])
        h = F.silu(F.linear(x, self.gate[e])) * h if self.swiglu else F.gelu(h, approximate="tanh")
        return F.linear(h, self.down[e])


class MoeMlp(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_experts = config.moe_n_experts
        self.noop = config.moe_noop_expert  # integrated MoDE: the router's last column
        self.token_choice = config.moe_routing == "token_choice"
        self.top_k = config.moe_top_k if self.token_choice else 1
        self.capacity_factor = config.moe_capacity_factor
        self.noop_capacity = config.moe_noop_capacity
        self.router = nn.Linear(config.hidden_size, self.n_experts + int(self.noop),
                                bias=config.moe_router_bias)
        self.experts = Experts(config)

    def forward(self, h, causal=False):
        b, t, d = h.shape
        probs = torch.softmax(self.router(h).float(), dim=-1)  # [B, T, E']
        if causal:
            taken = self.causal_choice(probs)
        elif self.token_choice:
            taken = self.token_choice_slots(probs)
        else:
            taken = self.expert_choice_slots(probs)
        rows = h.reshape(b * t, d)
        taken = taken.reshape(b * t, self.n_experts)
        gates = probs.reshape(b * t, -1)
        out = torch.zeros(b * t, d, dtype=torch.float32, device=h.device)
        for e in range(self.n_experts):  # expert order, as modtrain's scatter-add
            idx = torch.nonzero(taken[:, e]).flatten()
            if idx.numel():
                y = self.experts.one(e, rows[idx]).float() * gates[idx, e, None]
                out.index_add_(0, idx, y)
        return out.to(h.dtype).view(b, t, d)

    def expert_choice_slots(self, probs):
        """[B, T, E] bool: each real expert's k best tokens of the pool (ties to the lower
        position), the pool being the tokens the no-op expert did not take first."""
        b, t, _ = probs.shape
        e = self.n_experts
        pool = torch.ones(b, t, dtype=torch.bool, device=probs.device)
        noop = min(max(llround(self.noop_capacity * t), 0), t) if self.noop else 0
        if noop > 0:
            first = torch.sort(probs[..., e], dim=1, descending=True, stable=True).indices
            pool.scatter_(1, first[:, :noop], False)
        remaining = t - noop
        k = 0 if remaining == 0 else min(max(llround(self.capacity_factor * remaining / e), 1),
                                         remaining)
        taken = torch.zeros(b, t, e, dtype=torch.bool, device=probs.device)
        for j in range(e if k > 0 else 0):
            score = probs[..., j].masked_fill(~pool, -1.0)  # probabilities are >= 0
            best = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :k]
            taken[..., j].scatter_(1, best, True)
        return taken

    def token_choice_slots(self, probs):
        """[B, T, E] bool: each token's top_k experts (ties to the lower expert); first choices
        fill the K slots per expert in position order, then second choices; a choice that finds
        its expert full is dropped."""
        b, t, e = probs.shape
        k = min(max(llround(self.capacity_factor * self.top_k * t / e), 1), t)
        choice = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :self.top_k]
        used = torch.zeros(b, 1, e, dtype=torch.long, device=probs.device)
        taken = torch.zeros(b, t, e, dtype=torch.bool, device=probs.device)
        for c in range(self.top_k):
            pick = F.one_hot(choice[..., c], e)  # [B, T, E]
            before = torch.cumsum(pick, dim=1) - pick  # earlier tokens' picks of the same expert
            accepted = (pick > 0) & (used + before < k)
            taken |= accepted
            used = used + accepted.sum(dim=1, keepdim=True)
        return taken

    def causal_choice(self, probs):
        """[B, T, E] bool: each token's own top picks among E' (ties to the lower expert); a
        pick of the no-op expert takes no real expert."""
        picks = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :self.top_k]
        experts = torch.arange(self.n_experts, device=probs.device)
        return (picks[..., None] == experts).any(dim=-2)


class Router(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, 1, bias=config.mod_router_bias)

    def forward(self, x):
        return self.proj(x).squeeze(-1)  # [B, T]


class Predictor(nn.ModuleDict):
    # A ModuleDict, since "in" is a Python keyword: its names stay modtrain's predictor.in/out.
    def __init__(self, config):
        super().__init__({"in": nn.Linear(config.hidden_size, config.mod_predictor_hidden),
                          "out": nn.Linear(config.mod_predictor_hidden, 1)})

    def forward(self, x):
        return self["out"](F.silu(self["in"](x))).squeeze(-1)  # [B, T]


class Block(nn.Module):
    def __init__(self, config, routed, moe):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = Attention(config)
        self.norm2 = make_norm(config)
        self.moe = moe
        self.mlp = MoeMlp(config) if moe else Mlp(config)
        if routed:
            self.router = Router(config)
            if config.mod_causal == "predictor":
                self.predictor = Predictor(config)

    def delta(self, x, pos, cache=None, causal=False):
        """What the block adds to x: a + m (a dense block's output is x + delta). causal: an MoE
        MLP routes each token alone, else by the training rule over each sequence of x."""
        a = self.attn(self.norm1(x), pos, cache)
        h = self.norm2(x + a)
        return a + (self.mlp(h, causal) if self.moe else self.mlp(h))


class ModtrainPreTrainedModel(PreTrainedModel):
    config_class = ModtrainConfig
    base_model_prefix = ""
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        if isinstance(module, Experts):
            for p in module.parameters():
                nn.init.normal_(p, std=0.02)
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)


class ModtrainForCausalLM(ModtrainPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        routed, moe = set(config.mod_routed_blocks), set(config.moe_blocks)
        self.blocks = nn.ModuleList(Block(config, b in routed, b in moe)
                                    for b in range(config.num_hidden_layers))
        self.capacity = {b: c for b, c in zip(config.mod_routed_blocks, config.mod_capacity)}
        self.final_norm = make_norm(config)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._generating = False
        self._cache = None  # generate()'s KV cache: _DecodeCache, or None
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def gate(self, r):
        return torch.sigmoid(r) if self.config.mod_gate == "sigmoid" else r

    def routed_update(self, blk, x, pos, r, idx, cache=None, causal=False):
        """x [B, T, D] += g(r) * delta for the rows idx [B, C] (ascending) of each sequence."""
        d = x.shape[-1]
        rows = idx[..., None].expand(-1, -1, d)
        xs = torch.gather(x, 1, rows)
        ps = torch.gather(pos, 1, idx)
        g = self.gate(torch.gather(r, 1, idx))[..., None]
        return x.scatter_add(1, rows, g * blk.delta(xs, ps, cache, causal))

    def top_c(self, b, blk, x, pos):
        t = x.shape[1]
        r = blk.router(x)
        c = max(1, llround(self.capacity[b] * t))
        order = torch.sort(r, dim=1, descending=True, stable=True).indices[:, :c]
        return self.routed_update(blk, x, pos, r, order.sort(dim=1).values)

    def causal(self, blk, x, pos, caches=None):
        """caches: each sequence's cache of this block (only admitted tokens enter it)."""
        if self.config.mod_causal == "none":
            raise ValueError("mod_causal is none: this model has no causal routing "
                             "(generate() and routing='causal' need a predictor or aux_bce)")
        r = blk.router(x)
        decision = blk.predictor(x) if self.config.mod_causal == "predictor" else r
        out = []
        for i in range(x.shape[0]):  # each sequence admits its own tokens
            idx = torch.nonzero(decision[i] > 0).flatten()[None]
            if idx.numel() == 0:
                out.append(x[i:i + 1])
            else:
                out.append(self.routed_update(blk, x[i:i + 1], pos[i:i + 1], r[i:i + 1], idx,
                                              caches[i] if caches is not None else None,
                                              causal=True))
        return torch.cat(out, 0)

    def cached_forward(self, input_ids):
        """generate()'s step: input_ids [B, t] follow the cache's tokens; every block attends to
        its cached K/V, a routed block's holding only the tokens it admitted (as modtrain sample)."""
        cache = self._cache
        b, t = input_ids.shape
        pos = torch.arange(cache.length, cache.length + t, device=input_ids.device)[None].expand(b, t)
        x = self.embed(input_ids)
        for i, blk in enumerate(self.blocks):
            caches = cache.blocks[i]
            if i in self.capacity:
                x = self.causal(blk, x, pos, caches)
            else:
                x = torch.cat([x[j:j + 1] + blk.delta(x[j:j + 1], pos[j:j + 1], caches[j],
                                                      causal=True) for j in range(b)], 0)
        cache.length += t
        return x

    def forward(self, input_ids=None, attention_mask=None, labels=None, routing=None, **kwargs):
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("ModtrainForCausalLM: padded batches are not supported (top-C "
                             "routing would count the padding); pass sequences of one length")
        if self._cache is not None:
            x = self.cached_forward(input_ids)
        else:
            x = self.uncached_forward(input_ids, routing or
                                      ("causal" if self._generating else self.config.routing))
        h = self.final_norm(x)
        logits = self.lm_head(h) if hasattr(self, "lm_head") else h @ self.embed.weight.t()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def uncached_forward(self, input_ids, routing):
        b, t = input_ids.shape
        pos = torch.arange(t, device=input_ids.device)[None].expand(b, t)
        x = self.embed(input_ids)
        for i, blk in enumerate(self.blocks):
            if i not in self.capacity:
                x = x + blk.delta(x, pos, causal=routing == "causal")
            elif routing == "causal":
                x = self.causal(blk, x, pos)
            else:
                x = self.top_c(i, blk, x, pos)
        return x

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        if self._cache is not None and self._cache.length > 0:
            return {"input_ids": input_ids[:, self._cache.length:]}
        return {"input_ids": input_ids}

    def generate(self, *args, kv_cache=True, **kwargs):
        """transformers' generate() with causal routing. kv_cache=True keeps this model's own
        cache (each routed block's K/V for the tokens it admitted); False recomputes the prefix
        at every token, which gives the same tokens. Beam search is not supported with the cache
        (it would have to reorder it)."""
        kwargs["use_cache"] = False  # transformers' caches know nothing of routed blocks
        if kv_cache and kwargs.get("num_beams", 1) > 1:
            raise ValueError("ModtrainForCausalLM: beam search needs kv_cache=False")
        self._generating = True
        self._cache = _DecodeCache(len(self.blocks)) if kv_cache else None
        try:
            return super().generate(*args, **kwargs)
        finally:
            self._generating = False
            self._cache = None


class _DecodeCache:
    """blocks[layer][sequence]: that block's {"k", "v", "pos"} for one sequence, filled lazily."""

    def __init__(self, n_blocks):
        self.length = 0  # tokens of every sequence fed so far
        self.blocks = [_PerSequence() for _ in range(n_blocks)]


class _PerSequence(dict):
    def __getitem__(self, i):
        return self.setdefault(i, {})
