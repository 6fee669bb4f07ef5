#!/usr/bin/env bash
# modtrain prep stopped and resumed through the command line: a JSON Lines corpus of ~15 MB is
# prepared once uninterrupted, then again stopped by SIGTERM (exit 75) and by kill -9 in the
# middle and rerun to completion; every output file must equal the uninterrupted one's. Also a
# rerun of a finished prep is skipped, stdin works, and a bad JSON line is named by file:line.
# Usage: prep_resume_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "prep_resume_test: $*" >&2; exit 1; }

# Documents: lines of the repository's sources and docs, shuffled deterministically.
python3 - "$src" "$work/corpus.jsonl" <<'PY'
import glob, json, random, sys
src, out = sys.argv[1], sys.argv[2]
lines = []
for p in sorted(glob.glob(src + "/docs/*.md") + glob.glob(src + "/core/*.cpp")):
    lines += open(p, encoding="utf-8", errors="replace").read().splitlines()
rng = random.Random(1)
with open(out, "w") as f:
    size = 0
    while size < 15_000_000:
        doc = "\n".join(rng.choice(lines) for _ in range(rng.randint(5, 60)))
        line = json.dumps({"id": size, "text": doc}) + "\n"
        f.write(line)
        size += len(line)
PY
common=(--input "$work/corpus.jsonl" --tokenizer bpe --vocab-size 512 --bpe-sample-mb 4
  --val-fraction 0.01)
args=("${common[@]}" --shard-tokens 500000)
"$modtrain" prep "${args[@]}" --out "$work/whole" > "$work/whole.log"
[ "$(ls "$work/whole" | grep -c '^train_.*\.bin$')" -ge 5 ] || fail "expected several shards: $(ls "$work/whole")"
"$modtrain" prep "${args[@]}" --out "$work/whole" > "$work/again.log"
grep -q "already prepared" "$work/again.log" || fail "a finished prep was not skipped: $(cat "$work/again.log")"

# stop_and_resume SIGNAL: stop a prep once it has finished two training shards, rerun it.
stop_and_resume() {
  local sig=$1 dir=$work/stopped_$1
  "$modtrain" prep "${args[@]}" --out "$dir" > "$work/$sig.log" 2>&1 &
  local pid=$! waited=0
  until [ -e "$dir/train_000001.bin" ]; do
    sleep 0.05
    waited=$((waited + 1))
    [ $waited -lt 1200 ] || fail "$sig: no second shard after 60 s"
  done
  kill "-$sig" "$pid"
  local rc=0
  wait "$pid" || rc=$?
  if [ "$sig" = TERM ]; then
    [ $rc -eq 75 ] || fail "SIGTERM: exit $rc, expected 75: $(cat "$work/$sig.log")"
    grep -q "resume" "$work/$sig.log" || fail "SIGTERM: no word on how to resume"
  else
    [ $rc -eq 137 ] || fail "kill -9: exit $rc"
  fi
  [ -f "$dir/prep.state" ] || fail "$sig: no prep.state left to resume from (finished too early?)"
  [ ! -f "$dir/dataset.textproto" ] || fail "$sig: stopped prep wrote its manifest"
  "$modtrain" prep "${args[@]}" --out "$dir" > "$work/$sig.resume.log" ||
    fail "$sig: resume failed: $(cat "$work/$sig.resume.log")"
  grep -q "resumed" "$work/$sig.resume.log" || fail "$sig: the rerun did not resume"
  [ "$(ls "$work/whole")" = "$(ls "$dir")" ] || fail "$sig: other files: $(ls "$dir")"
  for f in "$work/whole"/*; do
    cmp "$f" "$dir/$(basename "$f")" || fail "$sig: $(basename "$f") differs"
  done
}
stop_and_resume TERM
stop_and_resume KILL

# A resumed prep with other options is refused, naming the option.
dir=$work/stopped_other
"$modtrain" prep "${args[@]}" --out "$dir" > /dev/null 2>&1 &
pid=$!
until [ -e "$dir/train_000000.bin" ]; do sleep 0.05; done
kill -TERM "$pid"; wait "$pid" || true
if "$modtrain" prep "${common[@]}" --shard-tokens 600000 --out "$dir" 2> "$work/other.err"; then
  fail "a resume with another --shard-tokens succeeded"
fi
grep -q -- "--shard-tokens was 500000, is now 600000" "$work/other.err" || fail "no option named: $(cat "$work/other.err")"

# stdin; a bad JSON line.
head -c 300000 "$src"/docs/*.md | "$modtrain" prep --input - --text-chunk-kb 16 --val-fraction 0.1 \
  --out "$work/stdin" > /dev/null || fail "prep from stdin failed"
printf '{"text": "a"}\n\n{"text": "b"}\n{"text": broken\n' > "$work/bad.jsonl"
if "$modtrain" prep --input "$work/bad.jsonl" --out "$work/bad" 2> "$work/bad.err"; then
  fail "a bad JSON line was accepted"
fi
grep -q "bad.jsonl:4: not JSON" "$work/bad.err" || fail "bad line not named: $(cat "$work/bad.err")"
echo "prep_resume_test: all checks passed"
