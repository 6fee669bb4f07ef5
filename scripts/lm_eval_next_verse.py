#!/usr/bin/env python3
"""A multiple-choice task from the KJV's validation split: which verse follows this one?
(configs/lm_eval/modtrain_next_verse.yaml; docs/hf.md).

Usage: lm_eval_next_verse.py DATA_DIR HF_DIR [OUT.jsonl] [--max-chars N] [--seed S]

DATA_DIR is a dataset that `modtrain prep --kjv` made (any tokenizer); its validation shards are
decoded with HF_DIR's tokenizer.json (scripts/lm_eval_val_text.py) and cut into verses, which
the KJV prints as "  N text", wrapped lines following, chapters headed "Book C" between blank
lines. Each item is a verse (the context, "  N text\n  N+1") and four choices: the text of the
verse that follows it in the same chapter and the texts of three other verses of the split,
drawn with the seed (default 1) and placed in a seeded order; "label" is the index of the true
one. Both verses of an item and every choice are at most N characters long (default 160: 401
items from the KJV's split); lm-eval cuts a context from the left when an item exceeds the
model's window (256 tokens in the tiny recipes), keeping the end of the verse before. Gold and
distractors come from the same pool of verses, so a scorer that ignores the context is right a
quarter of the time; a model beats 0.25 only by reading the verse before. Writes JSON Lines
{"ref" (the true verse, "Book C:N"), "context", "choices", "label"} to OUT (default
runs/lm_eval/next_verse.jsonl, where the task reads it).
Needs the `tokenizers` package (scripts/install_hf.sh installs it).
"""
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_eval_val_text import die, validation_texts  # noqa: E402

VERSE = re.compile(r"  (\d+) (.*)")


def verses(text, chapter0):
    """[(chapter, number, body, ref)] of the complete verses of text. chapter counts headers and
    blank-line breaks from chapter0, so that N and N + 1 with the same chapter are consecutive;
    ref is "Book C:N" under a header, "?:N" before the piece's first. A byte or BPE dataset has
    no end-of-text token, so where two documents meet a verse may take the next document's
    first lines; the numbers N, N + 1 keep such a junction out of the pairs. Text before the
    first verse and the last verse (a piece may end inside it) are left out."""
    out, current, chapter, header, blank = [], None, chapter0, "?", False
    for line in text.split("\n")[:-1]:  # the last is cut or empty: its verse is left unflushed
        m = VERSE.fullmatch(line)
        if m:
            if current:
                out.append(current)
            current = (chapter, int(m.group(1)), m.group(2), "%s:%s" % (header, m.group(1)))
        elif line.strip() and current:  # a wrapped line of the verse
            current = current[:2] + (current[2] + "\n" + line,) + current[3:]
        else:  # a blank line or a chapter header: the verse before is complete
            if current:
                out.append(current)
            elif line.strip() and blank:
                header = line.strip()
            current = None
            chapter += 1
        blank = not line.strip()
    return out, chapter + 1


def main():
    args = sys.argv[1:]
    opts = {"--max-chars": 160, "--seed": 1}
    for name in opts:
        if name in args:
            i = args.index(name)
            try:
                opts[name] = int(args[i + 1])
            except (IndexError, ValueError):
                die("%s takes an integer" % name)
            del args[i:i + 2]
    if len(args) not in (2, 3) or opts["--max-chars"] < 1:
        die(__doc__.split("\n\n")[1])
    data_dir, hf_dir = args[0], args[1]
    out = args[2] if len(args) == 3 else os.path.join("runs", "lm_eval", "next_verse.jsonl")
    texts, _ = validation_texts(data_dir, hf_dir)
    all_verses, chapter = [], 0
    for t in texts:
        vs, chapter = verses(t, chapter)
        all_verses += vs
    short = [v for v in all_verses if len(v[2]) <= opts["--max-chars"]]
    pool = sorted({v[2] for v in short})
    fits = set(short)
    pairs = [(a, b) for a, b in zip(all_verses, all_verses[1:])
             if a[0] == b[0] and b[1] == a[1] + 1 and a in fits and b in fits]
    if len(pool) < 4 or not pairs:
        die("%s: %d verses, %d of at most %d characters, %d consecutive pairs: not a KJV "
            "dataset (modtrain prep --kjv)?" % (data_dir, len(all_verses), len(short),
                                               opts["--max-chars"], len(pairs)))
    rng = random.Random(opts["--seed"])
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for a, b in pairs:
            choices = [b[2]] + rng.sample([t for t in pool if t != b[2]], 3)
            rng.shuffle(choices)
            f.write(json.dumps({"ref": b[3],
                                "context": "  %d %s\n  %d" % (a[1], a[2], b[1]),
                                "choices": choices, "label": choices.index(b[2])}) + "\n")
    print("%s: %d items (verse pairs of at most %d characters each), from %d verses of %s"
          % (out, len(pairs), opts["--max-chars"], len(all_verses), data_dir))


if __name__ == "__main__":
    main()
