#!/usr/bin/env python3
"""Hugging Face export and import end to end (docs/hf.md).

Usage: hf_cli_test.py MODTRAIN HF_TESTS SOURCE_DIR [--transformers PYTHON]

Without --transformers (CI; needs the `tokenizers`, `safetensors` and numpy packages, else exit
77): prep byte and BPE datasets, train a tiny Llama-shaped model, `modtrain export --format hf`;
the written tokenizer.json under the `tokenizers` library encodes the validation document to the
ids in the validation shard and decodes them back; `train --init-from DIR` at lr 1e-30 ends on the
exported weights bitwise, with model.mod on it trains with fresh routers, the MoD, MoE and MoDE
variants (VARIANTS) export as ModtrainForCausalLM and import back bitwise, and bad directories
are refused naming the file and field with nothing written.

With --transformers PYTHON (slow:hf): that interpreter, or $MOD_HF_PYTHON when set (torch + transformers, see
scripts/install_hf.sh; exit 77 when it lacks them) loads the export with
AutoModelForCausalLM.from_pretrained and its logits on the validation windows must equal
modtrain's forward (dumped by HF_TESTS's hidden case [.hf_logits_dump]) to 1e-4, top-C and
causal, and greedy generate() gives modtrain sample's text; lm-eval runs
configs/lm_eval/modtrain_val.yaml (the multiple-choice task: hf_lm_eval_test.py).
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77


def fail(msg):
    print("hf_cli_test: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, expect_ok=True, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if expect_ok and p.returncode != 0:
        fail("failed: " + " ".join(cmd) + "\n" + p.stdout + p.stderr)
    if not expect_ok and p.returncode == 0:
        fail("succeeded, expected an error: " + " ".join(cmd))
    return p


def shard_tokens(path):
    with open(path, "rb") as f:
        head = f.read(32)
        magic, version, width, _vocab, _res, count = struct.unpack("<8sIIIIQ", head)
        if magic != b"MODTOKS1":
            fail(path + ": not a modtrain shard")
        data = f.read(count * width)
    return list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), data))


def val_shard(data_dir):
    names = sorted(n for n in os.listdir(data_dir) if n.startswith("val") and n.endswith(".bin"))
    return os.path.join(data_dir, names[0])


SHAPE = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.d_ff=48",
         "--set", "model.n_layers=2", "--set", "model.seq_len=32", "--set", "model.rope_theta=5000",
         "--set", "model.norm_eps=1e-6", "--set", "optimizer.warmup_steps=1",
         "--set", "train.eval_batches=1", "--set", "train.batch_size=2"]
PROMPT = "Routing (x, y): 12 tokens. "  # fits seq_len 32 with 16 new tokens


def admissions(modtrain, run_dir):
    """modtrain sample's greedy text and its per-block 'admitted a/n' counts."""
    p = run([modtrain, "sample", "--checkpoint", run_dir, "--prompt", PROMPT,
             "--max-new-tokens", "16", "--temperature", "0"])
    return p.stdout.rstrip("\n"), [(int(a), int(n)) for a, n in
                                   re.findall(r"admitted (\d+)/(\d+)", p.stderr)]


def scramble_decisions(modtrain, run_dir, routed=True):
    """A few hundred steps leave a predictor that admits nearly every token or none, so the
    causal decisions would test little: the weights file is rewritten with the decision layers
    (predictor.in and .out, or the router under aux-BCE) drawn from N(0, 1/fan_in), biases 1e-3
    (not 0, which the lr-1e-30 round trip would move), seeds tried until greedy sampling has a
    routed block that admits some tokens and not others. MoE routers (mlp.router) are redrawn
    the same way, so that tokens spread over the experts and the no-op expert; without MoD
    (routed false) the first seed is kept. The file loses its seal (safetensors cannot write
    it), which modtrain accepts with a note."""
    import numpy as np
    import safetensors
    import safetensors.numpy
    path = os.path.join(run_dir, "model.safetensors")
    with safetensors.safe_open(path, "np") as f:
        meta = {k: v for k, v in f.metadata().items() if not k.startswith("crc32c.")}
        original = {k: f.get_tensor(k) for k in f.keys()}
    has_predictor = any(".predictor." in k for k in original)
    layers = (".mlp.router.",) + (() if not routed else
                                  (".predictor.",) if has_predictor else (".router.proj.",))
    for seed in range(20):
        rng = np.random.default_rng(seed)
        tensors = dict(original)
        for k, t in original.items():
            if any(layer in k for layer in layers):
                tensors[k] = (rng.standard_normal(t.shape) / np.sqrt(t.shape[-1])).astype(
                    np.float32) if k.endswith(".weight") else np.full_like(t, 1e-3)
        safetensors.numpy.save_file(tensors, path, metadata=meta)
        if not routed:
            return
        _, counts = admissions(modtrain, run_dir)
        if any(0 < a < n for a, n in counts):
            return
    fail(run_dir + ": no seed made a routed block admit some tokens and not others")


TINY = SHAPE + ["--set", "model.mlp=SWIGLU", "--set", "model.norm=RMS"]  # a Llama
# Models exported as ModtrainForCausalLM: name -> (recipe, --sets, training steps). MoD on tiny_mod
# (GELU) with a predictor; LayerNorm with aux-BCE, a sigmoid gate and a router bias in every block.
# MoE with token choice (2 of 4 SwiGLU experts of their own width, router bias, capacity factor
# 0.5 so that choices are dropped); integrated MoDE (expert choice with the no-op expert);
# staged MoDE (MoE in every block, MoD's routed block 1 with a predictor, capacity 0.25). The MoE
# models train fewer steps: their routers only need to be away from their initialisation.
VARIANTS = {
    "mod_predictor": ("tiny_mod", ["--set", "model.mod.capacity=0.25"], 300),
    "mod_aux_bce": ("tiny_mod", ["--set", "model.norm=LAYER", "--set", "model.mod.causal.method=AUX_BCE",
                                 "--set", "model.mod.router.gate=SIGMOID",
                                 "--set", "model.mod.router.bias=true",
                                 "--set", "model.mod.schedule=EVERY", "--set", "model.mod.capacity=0.5"],
                    300),
    "moe_token_choice": ("tiny_moe", ["--set", "model.mlp=SWIGLU", "--set", "model.moe.routing=TOKEN_CHOICE",
                                      "--set", "model.moe.top_k=2", "--set", "model.moe.capacity_factor=0.5",
                                      "--set", "model.moe.d_expert=40",
                                      "--set", "model.moe.router_bias=true"], 60),
    "mode_integrated": ("tiny_mode_integrated", [], 60),
    "mode_staged": ("tiny_mode_staged", ["--set", "model.mod.capacity=0.25",
                                         "--set", "model.mod.causal.predictor_hidden=16"], 60),
}
ROUTED = {"mod_predictor", "mod_aux_bce", "mode_staged"}  # with MoD's routed blocks
MOE = {"moe_token_choice", "mode_integrated", "mode_staged"}  # with MoE MLPs


def main():
    args = sys.argv[1:]
    python = None
    if "--transformers" in args:
        i = args.index("--transformers")
        python = args[i + 1]
        del args[i:i + 2]
    modtrain, hf_tests, src = args
    global modtrain_bin
    modtrain_bin = modtrain
    try:
        import numpy as np
        import safetensors.numpy
        import tokenizers
    except ImportError as e:
        print("hf_cli_test: skipped: python3 lacks %s" % e.name)
        sys.exit(SKIP)
    if python is not None:
        python = os.environ.get("MOD_HF_PYTHON") or python
        if not os.path.exists(python):
            print("hf_cli_test: skipped: no %s (run scripts/install_hf.sh, or set MOD_HF_PYTHON)"
                  % python)
            sys.exit(SKIP)
        probe = subprocess.run([python, "-c", "import torch, transformers"], capture_output=True)
        if probe.returncode != 0:
            print("hf_cli_test: skipped: %s cannot import torch and transformers "
                  "(scripts/install_hf.sh installs them)" % python)
            sys.exit(SKIP)

    work = tempfile.mkdtemp(prefix="modtrain_hf_")
    try:
        # A JSON Lines corpus: the docs' paragraphs; document 0 is the validation split.
        paragraphs = []
        for name in sorted(os.listdir(os.path.join(src, "docs"))):
            if name.endswith(".md"):
                text = open(os.path.join(src, "docs", name), encoding="utf-8").read()
                paragraphs += [p for p in text.split("\n\n") if p.strip()]
        docs = ["\n\n".join(paragraphs[i:i + 40]) for i in range(0, len(paragraphs), 40)]
        docs[0] += "\n\ttabs\t and  spaces \r\n 12345 caf\u00e9 \u2014 na\u00efve   \n  end  "
        corpus = os.path.join(work, "corpus.jsonl")
        with open(corpus, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")

        for kind, vocab in (("byte", 256), ("bpe", 400)):
            data = os.path.join(work, "data_" + kind)
            cmd = [modtrain, "prep", "--input", corpus, "--out", data, "--val-documents", "1",
                   "--tokenizer", kind]
            if kind == "bpe":
                cmd += ["--vocab-size", str(vocab)]
            run(cmd)
            run_dir = os.path.join(work, "run_" + kind)
            run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
                 "--run-dir", run_dir, "--data", data, "--set", "model.vocab_size=%d" % vocab,
                 "--set", "train.steps=3", "--set", "train.eval_every=3"] + TINY)
            out = os.path.join(work, "hf_" + kind)
            p = run([modtrain, "export", "--checkpoint", run_dir, "--format", "hf", "--out", out])
            if "LlamaForCausalLM" not in p.stdout or kind + " tokenizer" not in p.stdout:
                fail("export said: " + p.stdout)
            config = json.load(open(os.path.join(out, "config.json")))
            if config["architectures"] != ["LlamaForCausalLM"] or config["vocab_size"] != vocab:
                fail("config.json: %s" % config)

            # The tokenizer.json under the tokenizers library: the validation shard's ids.
            tok = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
            ids = tok.encode(docs[0], add_special_tokens=False).ids
            want = shard_tokens(val_shard(data))
            if ids != want:
                first = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b),
                             min(len(ids), len(want)))
                fail("%s tokenizer.json encodes the validation document to %d ids, the shard "
                     "holds %d; first difference at %d: %s vs %s" %
                     (kind, len(ids), len(want), first, ids[first:first + 5], want[first:first + 5]))
            if tok.decode(want, skip_special_tokens=False) != docs[0]:
                fail(kind + " tokenizer.json does not decode the validation ids to the document")
            print("%s: tokenizer.json encodes the validation document (%d tokens) as modtrain"
                  % (kind, len(want)))

        # A dataset made with a tokenizer.json (the one just written): the export copies it.
        hf_tok = os.path.join(work, "hf_bpe", "tokenizer.json")
        data_hf = os.path.join(work, "data_hf")
        run([modtrain, "prep", "--input", corpus, "--out", data_hf, "--val-documents", "1",
             "--tokenizer", hf_tok])
        run_hf = os.path.join(work, "run_hf")
        run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
             "--run-dir", run_hf, "--data", data_hf, "--set", "model.vocab_size=400",
             "--set", "train.steps=2", "--set", "train.eval_every=2"] + TINY)
        out = os.path.join(work, "hf_hf")
        p = run([modtrain, "export", "--checkpoint", run_hf, "--format", "hf", "--out", out])
        if "hf tokenizer" not in p.stdout:
            fail("export said: " + p.stdout)
        if open(os.path.join(out, "tokenizer.json"), "rb").read() != open(hf_tok, "rb").read():
            fail("the export of a tokenizer.json dataset did not copy its tokenizer.json")
        if shard_tokens(val_shard(data_hf)) != shard_tokens(val_shard(os.path.join(work, "data_bpe"))):
            fail("prep with the written tokenizer.json gave other ids than the BPE it was written from")
        print("tokenizer.json dataset: export copies it; prep with it gives the BPE's ids")

        # Import: one step at lr 1e-30 (lr must be positive) moves no f32 weight, so the run ends on
        # the imported weights bitwise.
        data = os.path.join(work, "data_bpe")
        exported = safetensors.numpy.load_file(os.path.join(work, "hf_bpe", "model.safetensors"))
        imp = os.path.join(work, "import")
        run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
             "--run-dir", imp, "--data", data, "--init-from", os.path.join(work, "hf_bpe"),
             "--set", "model.vocab_size=400", "--set", "train.steps=1", "--set", "train.eval_every=1",
             "--set", "optimizer.lr=1e-30", "--set", "optimizer.min_lr=0"] + TINY)
        again = os.path.join(work, "hf_again")
        run([modtrain, "export", "--checkpoint", imp, "--format", "hf", "--out", again])
        back = safetensors.numpy.load_file(os.path.join(again, "model.safetensors"))
        if sorted(back) != sorted(exported):
            fail("re-export holds %s, the export %s" % (sorted(back), sorted(exported)))
        for name, t in exported.items():
            if t.dtype != np.float32 or t.tobytes() != back[name].tobytes():
                fail("tensor %s differs after export -> import (lr 1e-30) -> export" % name)
        print("import -> train (lr 1e-30) -> export: %d tensors bitwise equal" % len(back))

        # Dense -> MoD: the Llama's weights and fresh routers, trained for 3 steps.
        p = run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
                 "--run-dir", os.path.join(work, "mod"), "--data", data,
                 "--init-from", os.path.join(work, "hf_bpe"), "--set", "model.vocab_size=400",
                 "--set", "train.steps=3", "--set", "train.eval_every=3"] + TINY +
                ["--set", "model.mod.enabled=true", "--set", "model.mod.capacity=0.5"])
        if "MoD router/predictor tensors start fresh" not in p.stdout:
            fail("the MoD conversion did not say its routers start fresh:\n" + p.stdout)

        # MoD, MoE and MoDE export as ModtrainForCausalLM under modtrain's names; --init-from DIR
        # reads it back.
        for name, (recipe, extra, steps) in VARIANTS.items():
            run_dir, out = os.path.join(work, "run_" + name), os.path.join(work, "hf_" + name)
            recipe = os.path.join(src, "configs/recipes/%s.textproto" % recipe)
            run([modtrain, "train", "--config", recipe, "--run-dir", run_dir, "--data", data,
                 "--set", "model.vocab_size=400", "--set", "train.steps=%d" % steps,
                 "--set", "train.eval_every=%d" % steps] + SHAPE + extra)
            if name in ROUTED or name in MOE:
                scramble_decisions(modtrain, run_dir, name in ROUTED)
            p = run([modtrain, "export", "--checkpoint", run_dir, "--format", "hf", "--out", out])
            if "ModtrainForCausalLM" not in p.stdout:
                fail("export said: " + p.stdout)
            again_run = os.path.join(work, "again_" + name)
            run([modtrain, "train", "--config", recipe, "--run-dir", again_run, "--data", data,
                 "--init-from", out, "--set", "model.vocab_size=400", "--set", "train.steps=1",
                 "--set", "train.eval_every=1", "--set", "optimizer.lr=1e-30",
                 "--set", "optimizer.min_lr=0"] + SHAPE + extra)
            a = safetensors.numpy.load_file(os.path.join(out, "model.safetensors"))
            b = safetensors.numpy.load_file(os.path.join(again_run, "model.safetensors"))
            if sorted(a) != sorted(b) or any(a[n].tobytes() != b[n].tobytes() for n in a):
                fail(name + ": export -> --init-from -> train (lr 1e-30) changed the weights")
            print("%s: ModtrainForCausalLM export -> import: %d tensors bitwise equal" % (name, len(a)))

        # Refusals name the file and the field; nothing is written.
        def refused(edit, want, extra=()):
            bad = os.path.join(work, "bad")
            shutil.rmtree(bad, ignore_errors=True)
            shutil.copytree(os.path.join(work, "hf_bpe"), bad)
            edit(bad)
            run_dir = os.path.join(work, "refused")
            p = run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
                     "--run-dir", run_dir, "--data", data, "--init-from", bad,
                     "--set", "model.vocab_size=400", "--set", "train.steps=1"] + TINY + list(extra),
                    expect_ok=False)
            if want not in p.stderr:
                fail("expected %r in:\n%s" % (want, p.stderr))
            if os.path.exists(os.path.join(run_dir, "model.safetensors")):
                fail("a refused import wrote " + run_dir + "/model.safetensors")

        def set_config(key, value):
            def edit(d):
                c = json.load(open(os.path.join(d, "config.json")))
                c[key] = value
                json.dump(c, open(os.path.join(d, "config.json"), "w"))
            return edit

        refused(set_config("num_key_value_heads", 1),
                "bad/config.json: num_key_value_heads is 1 with 2 attention heads")
        refused(set_config("architectures", ["MistralForCausalLM"]),
                "bad/config.json: architectures is [\"MistralForCausalLM\"]")
        refused(set_config("attention_bias", True), "bad/config.json: attention_bias is true")
        refused(set_config("intermediate_size", 64),
                "bad/config.json: intermediate_size is 64 but the run's model.d_ff is 48")

        def shard(d):  # the index names a shard that is not there
            os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, "model-00001-of-00002.safetensors"))
            names = list(exported)
            json.dump({"weight_map": {n: "model-0000%d-of-00002.safetensors" % (1 + i % 2)
                                      for i, n in enumerate(names)}},
                      open(os.path.join(d, "model.safetensors.index.json"), "w"))
        refused(shard, "names model-00002-of-00002.safetensors, which is missing")

        if python is not None:
            transformers_parity(python, hf_tests, src, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


PARITY = r'''
import sys, numpy as np, torch, transformers
out, tokens_path, logits_path, b, t, routing, arch = sys.argv[1:8]
b, t = int(b), int(t)
model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                          trust_remote_code=True)
model.eval()
assert type(model).__name__ == arch, type(model).__name__
tokens = torch.from_numpy(np.fromfile(tokens_path, dtype=np.int64).reshape(b, t))
# Each MoE layer's selections, counted so that the comparison is known to cover them: under
# causal routing the no-op expert's picks (integrated MoDE), under token choice dropped choices.
moe = {"tokens": 0, "noop": 0, "choices": 0, "kept": 0, "experts": set()}
def count(module, args, _out):
    h, causal = args
    probs = torch.softmax(module.router(h).float(), dim=-1)
    moe["tokens"] += h.shape[0] * h.shape[1]
    if causal:
        moe["experts"] |= set(torch.nonzero(module.causal_choice(probs))[:, -1].tolist())
    if causal and module.noop:
        moe["noop"] += int((probs.argmax(-1) == module.n_experts).sum())
    if not causal and module.token_choice:
        moe["choices"] += h.shape[0] * h.shape[1] * module.top_k
        moe["kept"] += int(module.token_choice_slots(probs).sum())
for m in model.modules():
    if type(m).__name__ == "MoeMlp":
        m.register_forward_hook(count)
with torch.no_grad():
    kwargs = {"routing": routing} if arch != "LlamaForCausalLM" else {}
    got = model(tokens, **kwargs).logits.numpy()
extra = ""
if moe["tokens"]:
    extra = "; MoE layers saw %d tokens" % moe["tokens"]
    cfg = model.config
    if routing == "causal":
        extra += ", experts %s picked" % sorted(moe["experts"])
        if len(moe["experts"]) < 2:
            sys.exit("causal routing picked experts %s only" % sorted(moe["experts"]))
    if routing == "causal" and cfg.moe_noop_expert:
        extra += ", %d took the no-op expert" % moe["noop"]
        if not 0 < moe["noop"] < moe["tokens"]:
            sys.exit("the no-op expert took %d of %d tokens: its causal pick is untested"
                     % (moe["noop"], moe["tokens"]))
    if routing == "top_c" and cfg.moe_routing == "token_choice":
        extra += ", %d of %d choices kept" % (moe["kept"], moe["choices"])
        if not 0 < moe["kept"] < moe["choices"]:
            sys.exit("token choice kept %d of %d choices: dropping is untested"
                     % (moe["kept"], moe["choices"]))
want = np.fromfile(logits_path, dtype=np.float32).reshape(got.shape)
diff = np.abs(got - want)
rel = diff / np.maximum(np.abs(want), 1.0)
print("transformers %s vs modtrain, %s routing: logits %s, max |diff| %.3g, max relative %.3g%s"
      % (transformers.__version__, routing, got.shape, diff.max(), rel.max(), extra))
if rel.max() > 1e-4:
    sys.exit("logits differ by more than 1e-4 relative")
'''


def transformers_parity(python, hf_tests, src, work):
    import numpy as np
    seq = 32
    val = np.array(shard_tokens(val_shard(os.path.join(work, "data_bpe"))), dtype=np.int64)
    b = min(4, len(val) // seq)
    if b < 1:
        fail("validation split too short for one window")
    tokens = os.path.join(work, "tokens.i64")
    val[:b * seq].tofile(tokens)
    script = os.path.join(work, "parity.py")
    open(script, "w").write(PARITY)

    def parity(run_dir, out, routing, arch):
        logits = os.path.join(work, "logits.f32")
        env = dict(os.environ, MOD_HF_DUMP_WEIGHTS=run_dir, MOD_HF_DUMP_TOKENS=tokens,
                   MOD_HF_DUMP_BATCH=str(b), MOD_HF_DUMP_OUT=logits, MOD_HF_DUMP_ROUTING=routing)
        run([hf_tests, "[.hf_logits_dump]"], env=env)
        p = run([python, script, out, tokens, logits, str(b), str(seq), routing, arch])
        print(os.path.basename(out) + ": " + p.stdout.strip())

    def greedy(run_dir, out, routed):
        want, counts = admissions(modtrain_bin, run_dir)
        g = run([python, "-c", GENERATE, out, PROMPT, "16"])
        got = g.stdout.rstrip("\n")
        if got != want:
            fail("%s: transformers generate() gives %r, modtrain sample %r" % (out, got, want))
        if routed and not any(0 < a < n for a, n in counts):
            fail("%s: no routed block admitted some tokens and not others (%s): the causal "
                 "decision is untested" % (out, counts))
        print(os.path.basename(out) + ": greedy generate() equals modtrain sample: %r, admitted %s"
              % (got, ", ".join("%d/%d" % c for c in counts) or "-"))

    parity(os.path.join(work, "run_bpe"), os.path.join(work, "hf_bpe"), "top_c",
           "LlamaForCausalLM")
    greedy(os.path.join(work, "run_bpe"), os.path.join(work, "hf_bpe"), False)
    for name in VARIANTS:
        run_dir, out = os.path.join(work, "run_" + name), os.path.join(work, "hf_" + name)
        if name in MOE:
            spread_experts(python, run_dir, out, tokens, b, seq, name in ROUTED)
        for routing in ("top_c", "causal"):
            parity(run_dir, out, routing, "ModtrainForCausalLM")
        greedy(run_dir, out, name in ROUTED)

    # A LlamaForCausalLM made by transformers (sharded, untied), imported, trained 20 steps as
    # MoD, exported (ModtrainForCausalLM) and loaded back by transformers.
    made = os.path.join(work, "made_by_transformers")
    run([python, "-c", MAKE_LLAMA, made])
    if not os.path.exists(os.path.join(made, "model.safetensors.index.json")):
        fail("transformers did not write a sharded directory")
    mod_run = os.path.join(work, "from_llama")
    p = run([modtrain_bin, "train", "--config", os.path.join(src, "configs/recipes/tiny_dense.textproto"),
             "--run-dir", mod_run, "--data", os.path.join(work, "data_bpe"), "--init-from", made,
             "--set", "model.vocab_size=400", "--set", "train.steps=20", "--set", "train.eval_every=20",
             "--set", "model.tie_embeddings=false", "--set", "model.mod.enabled=true",
             "--set", "model.mod.capacity=0.25"] + TINY)
    if "5 MoD router/predictor tensors start fresh" not in p.stdout:  # router, predictor in/out
        fail("the import did not report fresh routers:\n" + p.stdout)
    out = os.path.join(work, "hf_from_llama")
    run([modtrain_bin, "export", "--checkpoint", mod_run, "--format", "hf", "--out", out])
    parity(mod_run, out, "top_c", "ModtrainForCausalLM")

    lm_eval_perplexity(python, src, work)


def spread_experts(python, run_dir, out, tokens, b, t, routed):
    """Whether one redraw of the MoE routers (scramble_decisions) spreads the tokens depends on
    the trained hidden states (a shared direction in them can send nearly every token to one
    column). So the routers are redrawn again, seeds tried, and the model re-exported until,
    under causal routing on the parity windows, two real experts or more are picked and, with
    the no-op expert, it takes between 10% and 90% of the tokens; with MoD (routed), greedy
    sampling must still have a routed block that admits some tokens and not others."""
    import numpy as np
    import safetensors
    import safetensors.numpy
    path = os.path.join(run_dir, "model.safetensors")
    with safetensors.safe_open(path, "np") as f:
        meta = {k: v for k, v in f.metadata().items() if not k.startswith("crc32c.")}
        original = {k: f.get_tensor(k) for k in f.keys()}
    for seed in range(100, 120):
        rng = np.random.default_rng(seed)
        tensors = dict(original)
        for k, v in original.items():
            if ".mlp.router." in k:
                tensors[k] = (rng.standard_normal(v.shape) / np.sqrt(v.shape[-1])).astype(
                    np.float32) if k.endswith(".weight") else np.full_like(v, 1e-3)
        safetensors.numpy.save_file(tensors, path, metadata=meta)
        run([modtrain_bin, "export", "--checkpoint", run_dir, "--format", "hf", "--out", out])
        p = subprocess.run([python, "-c", SPREAD, out, tokens, str(b), str(t)],
                           capture_output=True, text=True)
        if p.returncode == 0 and routed:
            _, counts = admissions(modtrain_bin, run_dir)
            if not any(0 < a < n for a, n in counts):
                continue
        if p.returncode == 0:
            print("%s: MoE routers redrawn (seed %d): %s" % (os.path.basename(out), seed,
                                                             p.stdout.strip()))
            return
    fail(run_dir + ": no seed spread the tokens over the experts: " + p.stdout + p.stderr[-500:])


SPREAD = r'''
import sys, numpy as np, torch, transformers
out, tokens_path, b, t = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                          trust_remote_code=True)
tokens = torch.from_numpy(np.fromfile(tokens_path, dtype=np.int64).reshape(b, t))
counts = None
def count(module, args, _out):
    global counts
    probs = torch.softmax(module.router(args[0]).float(), dim=-1)
    c = torch.bincount(probs.argmax(-1).flatten(), minlength=probs.shape[-1])
    counts = c if counts is None else counts + c
for m in model.modules():
    if type(m).__name__ == "MoeMlp":
        m.register_forward_hook(count)
with torch.no_grad():
    model(tokens, routing="causal")
e = model.config.moe_n_experts
real = counts[:e]
print("causal first picks per column %s" % counts.tolist())
noop = counts[e].item() / counts.sum().item() if model.config.moe_noop_expert else 0.5
sys.exit(0 if int((real > 0).sum()) >= 2 and 0.1 <= noop <= 0.9 else 1)
'''


def lm_eval_perplexity(python, src, work):
    """lm-evaluation-harness on the repository's perplexity task (configs/lm_eval/modtrain_val.yaml)
    over the validation text that scripts/lm_eval_val_text.py writes, for the staged MoDE export,
    2 documents. (The multiple-choice task runs in slow:hf_lm_eval, on the KJV.)"""
    if subprocess.run([python, "-c", "import lm_eval, accelerate"], capture_output=True).returncode:
        print("lm-eval: part skipped: %s has no lm_eval or accelerate (scripts/install_hf.sh "
              "installs them)" % python)
        return
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    out = os.path.join(work, "hf_mode_staged")
    run([python, os.path.join(src, "scripts", "lm_eval_val_text.py"), os.path.join(work, "data_bpe"),
         out, os.path.join(work, "runs", "lm_eval", "val.jsonl"), "--doc-chars", "2000"])
    p = subprocess.run([python, "-m", "lm_eval", "--model", "hf", "--model_args",
                        "pretrained=%s,trust_remote_code=True,dtype=float32,prefix_token_id=10" % out,
                        "--tasks", "modtrain_val", "--include_path",
                        os.path.join(src, "configs", "lm_eval"), "--device", "cpu",
                        "--batch_size", "1", "--limit", "2"],
                       capture_output=True, text=True, env=env, cwd=work)  # the task's path is cwd's
    m = re.search(r"\|modtrain_val\|.*\|bits_per_byte\s*\|.*?\|\s*([0-9.]+)\|", p.stdout)
    if p.returncode != 0 or not m:
        fail("lm-eval modtrain_val printed no bits_per_byte:\n" + p.stdout[-2000:] + p.stderr[-2000:])
    print("lm-eval %s on configs/lm_eval/modtrain_val.yaml (2 documents): bits_per_byte %s"
          % (os.path.basename(out), m.group(1)))


MAKE_LLAMA = r'''
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                  rms_norm_eps=1e-6, rope_theta=5000.0, tie_word_embeddings=False,
                                  max_position_embeddings=32)
model = transformers.LlamaForCausalLM(config)
model.save_pretrained(sys.argv[1], max_shard_size="40KB")
'''


GENERATE = r'''
import sys, torch, transformers
out, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                          trust_remote_code=True)
tok = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True)
ids = tok(prompt, return_tensors="pt").input_ids
texts, logits = [], []
for kwargs in ([{}] if type(model).__name__ == "LlamaForCausalLM" else
               [{"kv_cache": True}, {"kv_cache": False}]):
    g = model.generate(ids, max_new_tokens=n, do_sample=False, output_logits=True,
                       return_dict_in_generate=True, attention_mask=torch.ones_like(ids),
                       pad_token_id=0, **kwargs)
    texts.append(prompt + tok.decode(g.sequences[0, ids.shape[1]:]))
    logits.append(torch.stack(g.logits))
if len(set(texts)) != 1:
    sys.exit("generate() with and without the KV cache differ: %r" % texts)
if len(logits) == 2:  # every step's logits, so a cache bug shows even where argmax agrees
    diff = (logits[0] - logits[1]).abs().max().item()
    if diff > 1e-4:
        sys.exit("generate()'s logits with and without the KV cache differ by %.3g" % diff)
print(texts[0])
'''


if __name__ == "__main__":
    main()
