#!/usr/bin/env python3
# hf_tokenizer_oracle: modtrain's tokenizer.json reader against the reference, the Hugging Face
# `tokenizers` library, file by file. Invariant checked, on every file below:
#   - what the library refuses (at load or at the first encode), modtrain refuses;
#   - what both accept encodes every text below to the same ids;
#   - what only the library accepts, modtrain refuses with "is not supported" naming the field
#     (a feature modtrain leaves out on purpose) or for one of the STRICTER reasons below, never
#     with a crash, a hang or a bare message.
# The files: the fuzz corpus and regressions of tests/fuzz/ and, from every seed, structure-aware
# mutations (fields removed, retyped or renamed, versions, merge forms, ids out of range or
# repeated, added tokens, nesting) where a reader that trusts the file goes wrong.
# Usage: hf_tokenizer_oracle.py HF_ENCODE_TOOL SOURCE_DIR. Exits 77 (skipped) without the library.
import glob
import json
import os
import subprocess
import sys
import tempfile

try:
    from tokenizers import Tokenizer
except ImportError as e:
    print(f"hf_tokenizer_oracle: skipped: python3 cannot import tokenizers ({e}); "
          "scripts/install_deps.sh installs it")
    sys.exit(77)

TOOL, SRC = sys.argv[1], sys.argv[2]
TEXTS = [
    "And God said, Let there be light: and there was light.",
    "  leading  spaces\tand\ttabs\r\nCRLF 1234567 3.14 don't I'M <|endoftext|> end",
    "café naïve 中文 日本語 한국어 العربية emoji 👍🏽 ſ K \u00a0nbsp\u3000",
    "x" * 3000 + " " + "ab" * 1500 + "\n" * 50 + "!?" * 400,
]
TIMEOUT_S = 20
# Files the library loads but modtrain refuses on purpose, each for a reason: an id that two
# vocabulary tokens share, or an added token that is empty or listed twice, makes decoding or
# the special-token split depend on the order of the file.
STRICTER = ("is used twice", "appears twice", ".content must not be empty")


def reference(data: bytes):
    """The library's verdict: ("ok", [ids per text]) or ("refused", reason)."""
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
        return "ok", [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    except BaseException as e:  # Exception, or a Rust panic surfacing as PanicException
        return "refused", f"{type(e).__name__}: {e}"[:200]


def ours(path: str, text_paths):
    """modtrain's verdict through hf_encode_tool: ("ok", ids) / ("refused", msg) / ("crash", msg)."""
    ids = []
    for tp in text_paths:
        try:
            r = subprocess.run([TOOL, path, tp], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return "crash", f"no answer within {TIMEOUT_S} s"
        err = r.stderr.decode("utf-8", "replace").strip()
        if r.returncode == 1 and err.startswith("hf_encode_tool: "):
            return "refused", err
        if r.returncode != 0:
            return "crash", f"exit {r.returncode}: {err[-300:]}"
        ids.append([int(t) for t in r.stdout.split()])
    return "ok", ids


def mutations(doc: dict):
    """Structure-aware edits of a valid tokenizer.json, each (name, document or raw text)."""
    def edit(fn):
        d = json.loads(json.dumps(doc))
        fn(d)
        return d

    model = doc.get("model", {})
    yield "unknown_top_field", edit(lambda d: d.__setitem__("extra", 1))
    yield "version_2", edit(lambda d: d.__setitem__("version", "2.0"))
    yield "version_number", edit(lambda d: d.__setitem__("version", 1.0))
    yield "no_version", edit(lambda d: d.pop("version", None))
    for key in ("model", "pre_tokenizer", "decoder", "added_tokens", "normalizer",
                "post_processor", "truncation", "padding"):
        yield f"no_{key}", edit(lambda d, k=key: d.pop(k, None))
        yield f"{key}_number", edit(lambda d, k=key: d.__setitem__(k, 7))
    yield "model_wordpiece", edit(lambda d: d["model"].__setitem__("type", "WordPiece"))
    yield "model_no_type", edit(lambda d: d["model"].pop("type", None))
    yield "model_unknown_field", edit(lambda d: d["model"].__setitem__("extra", 1))
    yield "byte_fallback", edit(lambda d: d["model"].__setitem__("byte_fallback", True))
    yield "dropout_half", edit(lambda d: d["model"].__setitem__("dropout", 0.5))
    yield "normalizer_nfc", edit(lambda d: d.__setitem__("normalizer", {"type": "NFC"}))
    yield "decoder_unknown", edit(lambda d: d.__setitem__("decoder", {"type": "Nope"}))
    merges = model.get("merges", [])
    vocab = model.get("vocab", {})
    if merges:
        as_strings = [m if isinstance(m, str) else " ".join(m) for m in merges]
        as_pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
        yield "merges_strings", edit(lambda d: d["model"].__setitem__("merges", as_strings))
        yield "merges_pairs", edit(lambda d: d["model"].__setitem__("merges", as_pairs))
        mixed = [as_strings[i] if i % 2 else as_pairs[i] for i in range(len(merges))]
        yield "merges_mixed", edit(lambda d: d["model"].__setitem__("merges", mixed))
        yield "merge_unknown_token", edit(
            lambda d: d["model"]["merges"].append(["zz_not_a_token", "yy_not_a_token"]))
        yield "merge_three_parts", edit(lambda d: d["model"]["merges"].append("a b c"))
        yield "merge_one_part", edit(lambda d: d["model"]["merges"].append("abc"))
        yield "merge_number", edit(lambda d: d["model"]["merges"].append(5))
        yield "merge_repeated", edit(lambda d: d["model"]["merges"].append(merges[0]))
    if vocab:
        first = next(iter(vocab))
        yield "vocab_id_negative", edit(lambda d: d["model"]["vocab"].__setitem__(first, -1))
        yield "vocab_id_huge", edit(lambda d: d["model"]["vocab"].__setitem__(first, 2**40))
        yield "vocab_id_float", edit(lambda d: d["model"]["vocab"].__setitem__(first, 1.5))
        yield "vocab_id_repeated", edit(
            lambda d: d["model"]["vocab"].__setitem__("zz_new", d["model"]["vocab"][first]))
        yield "vocab_gap", edit(lambda d: d["model"]["vocab"].__setitem__(first, len(vocab) + 100))
        yield "vocab_empty", edit(lambda d: d["model"].__setitem__("vocab", {}))
    added = doc.get("added_tokens") or []
    if added:
        yield "added_id_huge", edit(lambda d: d["added_tokens"][0].__setitem__("id", 2**33))
        yield "added_no_content", edit(lambda d: d["added_tokens"][0].pop("content", None))
        yield "added_empty_content", edit(lambda d: d["added_tokens"][0].__setitem__("content", ""))
        yield "added_repeated", edit(lambda d: d["added_tokens"].append(dict(d["added_tokens"][0])))
        yield "added_unknown_field", edit(lambda d: d["added_tokens"][0].__setitem__("x", 1))
    pre = doc.get("pre_tokenizer")
    if pre is not None:
        yield "pre_sequence_empty", edit(
            lambda d: d.__setitem__("pre_tokenizer", {"type": "Sequence", "pretokenizers": []}))
        yield "pre_nested_20", edit(lambda d: d.__setitem__("pre_tokenizer", nest(pre, 20)))
        yield "pre_nested_130", edit(lambda d: d.__setitem__("pre_tokenizer", nest(pre, 130)))
        yield "pre_unknown_type", edit(lambda d: d.__setitem__("pre_tokenizer", {"type": "Nope"}))
        yield "pre_bad_regex", edit(lambda d: d.__setitem__("pre_tokenizer", {
            "type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated",
                 "invert": False}, pre]}))
    text = json.dumps(doc)
    yield "truncated", text[: len(text) // 2]
    yield "trailing_garbage", text + " x"
    yield "not_an_object", "[" + text + "]"


def nest(pre: dict, depth: int) -> dict:
    for _ in range(depth):
        pre = {"type": "Sequence", "pretokenizers": [pre]}
    return pre


def main() -> int:
    files = sorted(glob.glob(os.path.join(SRC, "tests/fuzz/corpus/hf_tokenizer/*")) +
                   glob.glob(os.path.join(SRC, "tests/fuzz/regressions/hf_tokenizer/*")))
    failures, counts = [], {"agree_ok": 0, "agree_refused": 0, "unsupported": 0}
    with tempfile.TemporaryDirectory() as tmp:
        text_paths = []
        for i, t in enumerate(TEXTS):
            text_paths.append(os.path.join(tmp, f"text{i}.txt"))
            with open(text_paths[-1], "wb") as f:
                f.write(t.encode("utf-8"))
        cases = []
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            cases.append((os.path.relpath(path, SRC), data))
            try:
                doc = json.loads(data)
            except (ValueError, RecursionError):
                continue
            if isinstance(doc, dict) and isinstance(doc.get("model"), dict):
                for name, m in mutations(doc):
                    raw = m if isinstance(m, str) else json.dumps(m)
                    cases.append((f"{os.path.basename(path)}+{name}", raw.encode("utf-8")))
        for n, (name, data) in enumerate(cases):
            case_path = os.path.join(tmp, f"case{n}.json")
            with open(case_path, "wb") as f:
                f.write(data)
            ref, ref_out = reference(data)
            got, got_out = ours(case_path, text_paths)
            if got == "crash":
                failures.append(f"{name}: modtrain crashed or hung: {got_out}")
            elif ref == "refused" and got == "ok":
                failures.append(f"{name}: the library refuses ({ref_out}); modtrain accepts")
            elif ref == "ok" and got == "ok":
                if ref_out != got_out:
                    bad = next(i for i in range(len(TEXTS)) if ref_out[i] != got_out[i])
                    failures.append(f"{name}: ids differ on text {bad}: "
                                    f"library {ref_out[bad][:12]}..., modtrain {got_out[bad][:12]}...")
                else:
                    counts["agree_ok"] += 1
            elif ref == "ok":  # only modtrain refuses: allowed for features it leaves out
                if "is not supported" in got_out or any(k in got_out for k in STRICTER):
                    counts["unsupported"] += 1
                else:
                    failures.append(f"{name}: the library accepts; modtrain refuses without "
                                    f"naming an unsupported feature: {got_out}")
            else:
                counts["agree_refused"] += 1
    for f in failures:
        print("FAIL", f)
    print(f"hf_tokenizer_oracle: {len(cases)} files: {counts['agree_ok']} accepted alike, "
          f"{counts['agree_refused']} refused alike, {counts['unsupported']} refused by modtrain "
          f"as unsupported, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
