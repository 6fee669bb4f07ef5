#!/usr/bin/env python3
"""Trains configs/corpora/linux_bpe16k.json, the tokenizer of the Linux corpus (docs/grids.md,
"The Linux corpus"): a byte-level BPE of 16384 tokens (GPT-2's pre-tokenizer regex, 256 byte
tokens, 16127 merges and <|endoftext|>), made with Hugging Face's `tokenizers` library, which
`modtrain prep --tokenizer configs/corpora/linux_bpe16k.json` loads (train/data/hf_tokenizer.h).
The file is committed: every prep, here or on a GPU machine, tokenizes alike; nothing retrains it.

Sample: the first --sample-mb MB (1e6 bytes) of documents of scripts/linux_corpus.py's output,
which is ordered by a hash of each file's path, so the sample spans the whole tree. The
library's BPE trainer is deterministic for a given input (counts, then merges by count with
ties broken by the pair), so rerunning this on the same corpus gives the same file.

Usage: scripts/linux_corpus.py --out /tmp/linux.jsonl
       scripts/linux_tokenizer.py --corpus /tmp/linux.jsonl [--out configs/corpora/linux_bpe16k.json]
"""
import argparse
import json
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def sample(path, max_bytes):
    """The documents of a JSON Lines corpus, in order, until max_bytes of text."""
    seen = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            seen += len(text.encode("utf-8"))
            if seen > max_bytes:
                return
            yield text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="scripts/linux_corpus.py's JSON Lines output")
    ap.add_argument("--out", default="configs/corpora/linux_bpe16k.json")
    ap.add_argument("--vocab-size", type=int, default=16384)
    ap.add_argument("--sample-mb", type=float, default=64)
    args = ap.parse_args()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab_size, min_frequency=2, show_progress=False,
        special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(sample(args.corpus, int(args.sample_mb * 1e6)), trainer)
    tok.save(args.out)
    size = os.path.getsize(args.out)
    print(f"linux_tokenizer: {args.out}: vocab {tok.get_vocab_size()}, {size / 1e6:.2f} MB")
    if size > 2 * 1024 * 1024:
        print("linux_tokenizer: over the repository's 2 MiB limit for a tokenizer file", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
