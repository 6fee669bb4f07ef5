#!/usr/bin/env python3
"""A modtrain dataset's validation split as lm-eval documents (configs/lm_eval/modtrain_val.yaml).

Usage: lm_eval_val_text.py DATA_DIR HF_DIR [OUT.jsonl] [--doc-chars N]

Reads the validation shards that DATA_DIR/dataset.textproto lists, decodes their ids with the
export's tokenizer.json (HF_DIR, written by `modtrain export --format hf`, which encodes and
decodes as the dataset's tokenizer: docs/hf.md), splits the text at the dataset's end-of-text
token when it has one, then each piece into documents at the first line end at or after N
characters (default 4000; a document is what lm-eval's --limit counts), and writes them as JSON
Lines {"text": ...} to OUT (default runs/lm_eval/val.jsonl, where the task reads them).
Needs the `tokenizers` package (scripts/install_hf.sh installs it).
"""
import json
import os
import re
import struct
import sys


def die(msg):
    sys.exit("lm_eval_val_text: " + msg)


def shard_ids(path):
    with open(path, "rb") as f:
        magic, _version, width, _vocab, _reserved, count = struct.unpack("<8sIIIIQ", f.read(32))
        if magic != b"MODTOKS1" or width not in (2, 4):
            die(path + ": not a modtrain token shard (magic MODTOKS1, 2 or 4 bytes a token)")
        data = f.read(count * width)
    if len(data) != count * width:
        die("%s: %d tokens promised, %d bytes present" % (path, count, len(data)))
    return list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"), data))


def split_lines(text, n):
    """Pieces of text ending at the first line end at or after n characters (the last: the rest)."""
    out, start = [], 0
    while start < len(text):
        end = text.find("\n", start + n)
        end = len(text) if end < 0 else end + 1
        out.append(text[start:end])
        start = end
    return out


def validation_texts(data_dir, hf_dir):
    """The validation split of DATA_DIR decoded with HF_DIR's tokenizer.json, as one text per
    piece between end-of-text tokens (one text when the dataset has none)."""
    manifest_path = os.path.join(data_dir, "dataset.textproto")
    if not os.path.exists(manifest_path):
        die(manifest_path + ": no such file (a directory made by `modtrain prep`)")
    manifest = open(manifest_path, encoding="utf-8").read()
    shards = re.findall(r'\bval\s*\{[^}]*?path:\s*"([^"]+)"', manifest)
    if not shards:
        die(manifest_path + ": lists no val { path } shard")
    eot = re.search(r"\beot_token:\s*(\d+)", manifest)
    try:
        import tokenizers
    except ImportError:
        die("needs the tokenizers package (scripts/install_hf.sh)")
    tok_path = os.path.join(hf_dir, "tokenizer.json")
    if not os.path.exists(tok_path):
        die(tok_path + ": no such file (the directory `modtrain export --format hf --out` wrote)")
    tok = tokenizers.Tokenizer.from_file(tok_path)
    ids = [i for s in shards for i in shard_ids(os.path.join(data_dir, s))]
    pieces, current = [], []
    for i in ids:  # documents end at the end-of-text token, which is not text
        if eot and i == int(eot.group(1)):
            pieces.append(current)
            current = []
        else:
            current.append(i)
    pieces.append(current)
    return [tok.decode(p, skip_special_tokens=False) for p in pieces if p], len(ids)


def main():
    args = sys.argv[1:]
    doc_chars = 4000
    if "--doc-chars" in args:
        i = args.index("--doc-chars")
        doc_chars = int(args[i + 1])
        del args[i:i + 2]
    if len(args) not in (2, 3) or doc_chars < 1:
        die(__doc__.split("\n\n")[1])
    data_dir, hf_dir = args[0], args[1]
    out = args[2] if len(args) == 3 else os.path.join("runs", "lm_eval", "val.jsonl")
    texts, n_ids = validation_texts(data_dir, hf_dir)
    docs = [d for t in texts for d in split_lines(t, doc_chars)]
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    print("%s: %d documents, %d characters, from %d validation tokens of %s"
          % (out, len(docs), sum(len(d) for d in docs), n_ids, data_dir))


if __name__ == "__main__":
    main()
