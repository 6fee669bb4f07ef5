#!/usr/bin/env python3
"""lm-evaluation-harness on the repository's multiple-choice task, offline (docs/hf.md).

Usage: hf_lm_eval_test.py MODTRAIN SOURCE_DIR PYTHON

PYTHON, or $MOD_HF_PYTHON when set, must import torch, transformers, tokenizers, lm_eval and
accelerate (scripts/install_hf.sh); `modtrain prep --kjv` needs Debian's `bible` (bible-kjv).
Without either the test exits 77 saying which. Otherwise: prep the KJV, train a small MoD model
(tiny_mod, 2 layers of width 32) for 20 steps, export it (ModtrainForCausalLM), write the items
with scripts/lm_eval_next_verse.py and check each against the validation text (the context
followed by the labelled choice is the text itself; the other three are not), then run lm_eval
on configs/lm_eval/modtrain_next_verse.yaml (40 items) with the network off and require acc and
acc_norm, numbers in [0, 1]. Such a model is near chance (0.25); docs/hf.md gives a trained
one's figure.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
ITEMS = 40


def fail(msg):
    print("hf_lm_eval_test: " + msg, file=sys.stderr)
    sys.exit(1)


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        fail("failed: " + " ".join(cmd) + "\n" + p.stdout[-3000:] + p.stderr[-3000:])
    return p


def check_items(src, data, hf, path):
    """Run under PYTHON: every item's label points at the verse that follows its context."""
    sys.path.insert(0, os.path.join(src, "scripts"))
    from lm_eval_val_text import validation_texts
    text = "\n".join(validation_texts(data, hf)[0])
    items = [json.loads(line) for line in open(path, encoding="utf-8")]
    if len(items) < ITEMS:
        fail("%s: %d items, want %d or more" % (path, len(items), ITEMS))
    for n, item in enumerate(items):
        choices, label = item["choices"], item["label"]
        if len(choices) != 4 or len(set(choices)) != 4 or label not in range(4):
            fail("%s:%d: want 4 distinct choices and a label in 0..3: %s" % (path, n + 1, item))
        follows = [item["context"] + " " + c + "\n" in text for c in choices]
        if follows != [i == label for i in range(4)]:
            fail("%s:%d (%s): label %d, but the choices that follow the context in the "
                 "validation text are %s" % (path, n + 1, item["ref"], label,
                                             [i for i, f in enumerate(follows) if f]))
    print("%s: %d items, each label the verse that follows its context" % (path, len(items)))


def main():
    if sys.argv[1:2] == ["--check-items"]:
        check_items(*sys.argv[2:])
        return
    modtrain, src, python = sys.argv[1:]
    python = os.environ.get("MOD_HF_PYTHON") or python
    if not os.path.exists(python):
        print("hf_lm_eval_test: skipped: no %s (run scripts/install_hf.sh, or set MOD_HF_PYTHON)"
              % python)
        sys.exit(SKIP)
    modules = "torch, transformers, tokenizers, lm_eval, accelerate"
    if subprocess.run([python, "-c", "import " + modules], capture_output=True).returncode:
        print("hf_lm_eval_test: skipped: %s cannot import %s (scripts/install_hf.sh installs "
              "them)" % (python, modules))
        sys.exit(SKIP)
    if not shutil.which("bible"):
        print("hf_lm_eval_test: skipped: no `bible` command for modtrain prep --kjv (Debian's "
              "bible-kjv; scripts/install_deps.sh installs it)")
        sys.exit(SKIP)

    work = tempfile.mkdtemp(prefix="modtrain_lm_eval_")
    try:
        data, run_dir, hf = (os.path.join(work, n) for n in ("kjv", "run", "hf"))
        run([modtrain, "prep", "--kjv", "--out", data])
        run([modtrain, "train", "--config", os.path.join(src, "configs/recipes/tiny_mod.textproto"),
             "--run-dir", run_dir, "--data", data, "--set", "model.d_model=32",
             "--set", "model.n_heads=2", "--set", "model.d_ff=64", "--set", "model.n_layers=2",
             "--set", "train.steps=20", "--set", "train.eval_every=20",
             "--set", "train.eval_batches=1", "--set", "train.batch_size=2",
             "--set", "optimizer.warmup_steps=2"])
        run([modtrain, "export", "--checkpoint", run_dir, "--format", "hf", "--out", hf])
        items = os.path.join(work, "runs", "lm_eval", "next_verse.jsonl")  # where the task reads
        print(run([python, os.path.join(src, "scripts", "lm_eval_next_verse.py"), data, hf],
                  cwd=work).stdout.strip())
        print(run([python, os.path.abspath(__file__), "--check-items", src, data, hf, items])
              .stdout.strip())

        env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
        results = os.path.join(work, "results")
        # The byte tokenizer has no BOS: lm-eval's context prefix is "\n" (id 10).
        run([python, "-m", "lm_eval", "--model", "hf", "--model_args",
             "pretrained=%s,trust_remote_code=True,dtype=float32,prefix_token_id=10" % hf,
             "--tasks", "modtrain_next_verse", "--include_path",
             os.path.join(src, "configs", "lm_eval"), "--device", "cpu", "--batch_size", "1",
             "--limit", str(ITEMS), "--output_path", results], env=env, cwd=work)
        files = glob.glob(os.path.join(results, "**", "results_*.json"), recursive=True)
        if len(files) != 1:
            fail("lm-eval wrote %d results files under %s, want 1" % (len(files), results))
        metrics = json.load(open(files[0]))["results"].get("modtrain_next_verse", {})
        for name in ("acc,none", "acc_norm,none"):
            v = metrics.get(name)
            if not isinstance(v, (int, float)) or not 0 <= v <= 1:
                fail("lm-eval reported %s = %r, want a number in [0, 1]: %s" % (name, v, metrics))
        print("lm-eval modtrain_next_verse (%d items, 20-step model): acc %.3f, acc_norm %.3f"
              % (ITEMS, metrics["acc,none"], metrics["acc_norm,none"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
