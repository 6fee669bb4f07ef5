#!/usr/bin/env bash
# Packs the Linux corpus for a lent GPU machine (docs/grids.md, "The Linux corpus"), which has no
# network and receives at most 64 MiB a call, the bundle included: linux_corpus.jsonl.xz at the
# repository root (git-ignored; made on demand, never committed). It holds the first CORPUS_MB
# MB (default 240) of scripts/linux_corpus.py's output, a hash-ordered sample of the whole tree,
# as JSON Lines compressed with xz -9; the whole corpus is 768 MB. `scripts/gpu_run.sh grid`
# unpacks it there and runs `modtrain prep` on it with the committed tokenizer.
# Usage: scripts/gpu_corpus.sh   (CORPUS_MB=N, CORPUS_MAX_MIB=M (default 40),
#        LINUX_TARBALL=path (default /usr/src/linux-source-6.1.tar.xz, Debian's linux-source-6.1))
set -euo pipefail
cd "$(dirname "$0")/.."
mb=${CORPUS_MB:-240}
max_mib=${CORPUS_MAX_MIB:-40}
tarball=${LINUX_TARBALL:-/usr/src/linux-source-6.1.tar.xz}
[ -f "$tarball" ] || {
  echo "gpu_corpus: $tarball missing (apt-get install linux-source-6.1)" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 scripts/linux_corpus.py --tarball "$tarball" --max-mb "$mb" --out "$tmp/linux.jsonl"
# -T0: blocks compressed in parallel, so that the GPU machine also decompresses in parallel.
xz -9 -T0 -c "$tmp/linux.jsonl" > "$tmp/linux.jsonl.xz"
size=$(stat -c %s "$tmp/linux.jsonl.xz")
text=$(stat -c %s "$tmp/linux.jsonl")
mv "$tmp/linux.jsonl.xz" linux_corpus.jsonl.xz
echo "gpu_corpus: linux_corpus.jsonl.xz, $((size / 1048576)) MiB ($size bytes) for $((text / 1000000)) MB of JSON Lines"
if [ "$size" -gt $((max_mib * 1048576)) ]; then
  echo "gpu_corpus: over $max_mib MiB: pack less (CORPUS_MB < $mb)" >&2
  exit 1
fi
# One call carries the working tree, the bundle and this file: 64 MiB in all.
if [ -f gpu_bundle.tar.xz ]; then
  tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{ s += $1 } END { print s }')
  total=$((tree + size + $(stat -c %s gpu_bundle.tar.xz)))
  echo "gpu_corpus: with gpu_bundle.tar.xz and the tracked tree: $((total / 1048576)) MiB of the 64 MiB a call carries"
  [ "$total" -le $((64 * 1048576)) ] || { echo "gpu_corpus: over 64 MiB: pack less (CORPUS_MB)" >&2; exit 1; }
fi
