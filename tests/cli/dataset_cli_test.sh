#!/usr/bin/env bash
# Datasets through the command line, end to end:
# - a Hugging Face tokenizer.json (trained here with the `tokenizers` library) preps a JSON Lines
#   corpus: every document's tokens, as the library encodes them, followed by <|endoftext|>, in
#   order, fill the two splits; training on it runs, and sample decodes with the dataset's
#   tokenizer (skipped, saying so, without the library);
# - llm.c shards (written here) are indexed where they lie and trained on;
# - resuming after a training shard changed is refused, naming the shard;
# - a training split too small for one batch, or a validation split too small for one evaluation,
#   is refused before the first step, naming the dataset and the split.
# Usage: dataset_cli_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "dataset_cli_test: $*" >&2; exit 1; }
tiny=(--set model.d_model=64 --set model.n_heads=2 --set model.d_ff=128 --set model.n_layers=2
      --set model.seq_len=64 --set optimizer.warmup_steps=2 --set train.eval_batches=2)

# --- a tokenizer.json and a JSON Lines corpus ---
if python3 -c "import tokenizers" 2>/dev/null; then
  python3 - "$src" "$work" <<'PY'
import glob, json, random, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
src, work = sys.argv[1], sys.argv[2]
lines = []
for p in sorted(glob.glob(src + "/docs/*.md")):
    lines += [l for l in open(p, encoding="utf-8").read().splitlines() if l.strip()]
rng = random.Random(3)
docs = ["\n".join(rng.choice(lines) for _ in range(rng.randint(3, 30))) for _ in range(400)]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(work + "/tokenizer.json")
with open(work + "/corpus.jsonl", "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
eot = tok.token_to_id("<|endoftext|>")
with open(work + "/expected.txt", "w") as f:  # every document's ids + EOT, in order
    f.write(" ".join(str(i) for d in docs for i in tok.encode(d).ids + [eot]))
print(tok.get_vocab_size(), eot, file=open(work + "/vocab.txt", "w"))
PY
  read -r vocab eot < "$work/vocab.txt"
  "$modtrain" prep --input "$work/corpus.jsonl" --tokenizer "$work/tokenizer.json" \
    --out "$work/hf" --val-fraction 0.1 --shard-tokens 20000 > "$work/prep.log"
  grep -q "eot_token: $eot" "$work/hf/dataset.textproto" || fail "manifest lacks eot_token $eot"
  [ -f "$work/hf/tokenizer.json" ] || fail "prep did not copy tokenizer.json"
  # The splits interleave by document: together, in document order, they are the library's ids.
  python3 - "$work" <<'PY' || fail "prepped tokens differ from the tokenizers library's"
import re, struct, sys
work = sys.argv[1]
manifest = open(work + "/hf/dataset.textproto").read()
def tokens(split):
    out = []
    for path in re.findall(split + r' \{\s*path: "([^"]+)"', manifest):
        b = open(work + "/hf/" + path, "rb").read()
        width, count = struct.unpack_from("<I", b, 12)[0], struct.unpack_from("<Q", b, 24)[0]
        out += list(struct.unpack_from("<%d%s" % (count, "H" if width == 2 else "I"), b, 32))
    return out
expected = [int(t) for t in open(work + "/expected.txt").read().split()]
train, val = tokens("train"), tokens("val")
eot = expected[-1]
def docs(ids):
    d, cur = [], []
    for t in ids:
        cur.append(t)
        if t == eot:
            d.append(tuple(cur)); cur = []
    assert not cur, "a split does not end with the end-of-text token"
    return d
all_docs = docs(expected)
got_train, got_val = docs(train), docs(val)
assert len(got_train) + len(got_val) == len(all_docs), (len(got_train), len(got_val), len(all_docs))
assert got_val, "no validation documents"
# Each split is a subsequence of the corpus's documents, in order, and they partition it.
it_t, it_v = iter(got_train), iter(got_val)
nt, nv = next(it_t, None), next(it_v, None)
for d in all_docs:
    if d == nt: nt = next(it_t, None)
    elif d == nv: nv = next(it_v, None)
    else: sys.exit("document out of order or changed")
assert nt is None and nv is None
PY
  "$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" --run-dir "$work/hf_run" \
    --data "$work/hf" "${tiny[@]}" --set model.vocab_size="$vocab" --set train.steps=6 \
    --set train.eval_every=6 > "$work/hf_train.log"
  grep -q "data $work/hf: 1 training shards\|data $work/hf: [0-9]* training shards" "$work/hf_train.log" \
    || fail "train did not report the dataset: $(head -5 "$work/hf_train.log")"
  "$modtrain" sample --checkpoint "$work/hf_run" --prompt "The loader" --max-new-tokens 8 --seed 1 \
    > "$work/sample.txt"
  grep -q "^The loader" "$work/sample.txt" || fail "sample did not decode with tokenizer.json: $(cat "$work/sample.txt")"
else
  echo "dataset_cli_test: skipping the tokenizer.json part: python3 cannot import tokenizers"
fi

# --- llm.c shards, indexed in place ---
python3 - "$work" <<'PY'
import random, struct, sys
work = sys.argv[1]
rng = random.Random(5)
for name, n in (("fw_train_000001.bin", 30000), ("fw_train_000002.bin", 12000), ("fw_val_000000.bin", 6000)):
    with open(f"{work}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *(rng.randrange(50257) for _ in range(n))))
PY
"$modtrain" prep --out "$work/llmc" --format llmc --train-shards "$work/fw_train_000001.bin" \
  "$work/fw_train_000002.bin" --val-shards "$work/fw_val_000000.bin" > /dev/null
grep -q "format: LLMC" "$work/llmc/dataset.textproto" || fail "no llm.c manifest"
"$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" --run-dir "$work/llmc_run" \
  --data "$work/llmc" "${tiny[@]}" --set model.vocab_size=50257 --set train.steps=4 \
  --set train.eval_every=4 --set checkpoint.every_steps=2 > "$work/llmc_train.log"
grep -q "2 training shards" "$work/llmc_train.log" || fail "train did not see both llm.c shards"

# --- a training shard changed after the checkpoint: resume refuses, naming it ---
python3 - "$work/fw_train_000002.bin" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:  # one token, same size
    f.seek(1024 + 2 * 10)
    f.write(b"\x07\x00")
PY
if "$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" --run-dir "$work/llmc_run" \
    --data "$work/llmc" "${tiny[@]}" --set model.vocab_size=50257 --set train.steps=6 \
    --set train.eval_every=6 --resume auto > "$work/resume.log" 2>&1; then
  fail "resume on a changed shard succeeded"
fi
grep -q "fw_train_000002.bin changed since the checkpoint" "$work/resume.log" \
  || fail "resume error does not name the changed shard: $(cat "$work/resume.log")"

# --- too little data: refused at start (not at the first evaluation), naming dataset and split ---
python3 - "$work" <<'PY'
import struct, sys
with open(sys.argv[1] + "/fw_small.bin", "wb") as f:  # 33 tokens: one window of 65 does not fit
    f.write(struct.pack("<256i", 20240520, 1, 33, *([0] * 253)))
    f.write(struct.pack("<33H", *range(33)))
PY
for split in val train; do
  if [ $split = val ]; then shards=(--train-shards "$work/fw_train_000001.bin" --val-shards "$work/fw_small.bin")
  else shards=(--train-shards "$work/fw_small.bin" --val-shards "$work/fw_val_000000.bin"); fi
  "$modtrain" prep --out "$work/small_$split" --format llmc "${shards[@]}" > /dev/null
  if "$modtrain" train --config "$src/configs/recipes/tiny_mod.textproto" --run-dir "$work/small_${split}_run" \
      --data "$work/small_$split" "${tiny[@]}" --set model.vocab_size=50257 --set train.steps=4 \
      --set train.eval_every=4 > "$work/small_$split.log" 2>&1; then
    fail "training on a $split split of 33 tokens succeeded"
  fi
  grep -q "dataset $work/small_$split ($split split): 33 " "$work/small_$split.log" \
    || fail "the error does not name the dataset and the $split split: $(cat "$work/small_$split.log")"
  ! grep -q "^step " "$work/small_$split.log" || fail "$split: training steps ran before the error"
done
echo "dataset_cli_test: all checks passed"
