#!/usr/bin/env bash
# The Linux corpus recipe (scripts/linux_corpus.py, docs/grids.md) on a small stand-in for
# Debian's kernel tarball, made here (CI needs no linux-source): it takes C, headers, .rst/.txt,
# Kconfig* and Makefiles and leaves out other suffixes, asic_reg/, files over --max-file-kb,
# binaries and non-UTF-8 text; two runs write the same bytes; --max-mb writes a prefix of the
# same order; `modtrain prep` with the committed configs/corpora/linux_bpe16k.json gives the same
# shards on two runs, copies that file unchanged and seals it in the manifest.
# Usage: linux_corpus_test.sh MODTRAIN SOURCE_DIR
set -euo pipefail
modtrain=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "linux_corpus_test: $*" >&2; exit 1; }
tok=$src/configs/corpora/linux_bpe16k.json
[ -f "$tok" ] || fail "$tok missing"
[ "$(stat -c %s "$tok")" -lt $((2 * 1024 * 1024)) ] || fail "$tok is over 2 MiB"

# A kernel tree in miniature: the project's own sources stand in for C and headers.
tree=$work/linux-source-6.1
mkdir -p "$tree"/{kernel,include/linux,Documentation/admin,arch/x86,scripts}
mkdir -p "$tree/drivers/gpu/drm/amd/include/asic_reg/dcn"
i=0
for f in "$src"/core/*.cpp; do cp "$f" "$tree/kernel/k$i.c"; i=$((i + 1)); done
i=0
for f in "$src"/core/*.h; do cp "$f" "$tree/include/linux/h$i.h"; i=$((i + 1)); done
cp "$src/docs/grids.md" "$tree/Documentation/admin/grids.rst"
cp "$src/README.md" "$tree/Documentation/readme.txt"
printf 'config MODTRAIN\n\tbool "MoD"\n' > "$tree/Kconfig"
printf 'config X86_DEBUG\n\tbool\n' > "$tree/arch/x86/Kconfig.debug"
printf 'obj-y += kernel/\n' > "$tree/Makefile"
printf 'print("marker_py_7f3a")\n' > "$tree/scripts/tool.py"
printf '#define MARKER_ASIC_7f3a 1\n' > "$tree/drivers/gpu/drm/amd/include/asic_reg/dcn/regs.h"
printf 'int marker_nul_7f3a;\0\n' > "$tree/kernel/blob.c"
printf 'marker_latin1_7f3a caf\xe9\n' > "$tree/kernel/latin1.c"
head -c 300000 /dev/zero | tr '\0' 'x' > "$tree/include/linux/huge_table.h"
tar -C "$work" -cJf "$work/linux.tar.xz" linux-source-6.1
taken=$(find "$tree" -type f \( -name '*.c' -o -name '*.h' -o -name '*.rst' -o -name '*.txt' \
  -o -name 'Kconfig*' -o -name Makefile \) | wc -l)
expected=$((taken - 4))  # less the asic_reg header, the NUL file, the Latin-1 file, the huge table

corpus=$src/scripts/linux_corpus.py
python3 "$corpus" --tarball "$work/linux.tar.xz" --out "$work/a.jsonl" > "$work/a.log"
python3 "$corpus" --tarball "$work/linux.tar.xz" --out "$work/b.jsonl" > /dev/null
cmp -s "$work/a.jsonl" "$work/b.jsonl" || fail "two runs of linux_corpus.py differ"
[ "$(wc -l < "$work/a.jsonl")" -eq "$expected" ] \
  || fail "expected $expected documents, got $(wc -l < "$work/a.jsonl"): $(cat "$work/a.log")"
grep -q "skipped 1 binary, 1 not UTF-8" "$work/a.log" || fail "skips not reported: $(cat "$work/a.log")"
for absent in marker_py_7f3a MARKER_ASIC_7f3a marker_nul_7f3a xxxxxxxxxxxxxxxx marker_latin1_7f3a; do
  ! grep -qF -- "$absent" "$work/a.jsonl" || fail "the corpus holds '$absent'"
done
for present in 'config MODTRAIN' 'X86_DEBUG' 'obj-y' '# isoFLOP grids'; do
  grep -qF -- "$present" "$work/a.jsonl" || fail "the corpus lacks '$present'"
done
# --max-mb: the first documents of the same order.
python3 "$corpus" --tarball "$work/linux.tar.xz" --out "$work/p.jsonl" --max-mb 0.1 > /dev/null
n=$(wc -l < "$work/p.jsonl")
[ "$n" -gt 0 ] && [ "$n" -lt "$expected" ] || fail "--max-mb 0.1 wrote $n of $expected documents"
head -n "$n" "$work/a.jsonl" | cmp -s - "$work/p.jsonl" || fail "--max-mb did not write a prefix"

# prep twice with the saved tokenizer: the same shards and manifest; the tokenizer is the file.
for d in d1 d2; do
  "$modtrain" prep --input "$work/a.jsonl" --tokenizer "$tok" --val-fraction 0.05 --threads 2 \
    --out "$work/$d" > "$work/$d.log" 2>&1 || fail "prep failed: $(cat "$work/$d.log")"
done
grep -qF "$tok tokenizer (vocab 16384)" "$work/d1.log" \
  || fail "prep did not load the 16k tokenizer: $(cat "$work/d1.log")"
for f in "$work"/d1/*.bin "$work/d1/dataset.textproto"; do
  cmp -s "$f" "$work/d2/$(basename "$f")" || fail "$(basename "$f") differs between two preps"
done
[ "$(ls "$work"/d1/train_*.bin | wc -l)" -ge 1 ] && [ "$(ls "$work"/d1/val_*.bin | wc -l)" -ge 1 ] \
  || fail "prep wrote no train or val shard"
cmp -s "$tok" "$work/d1/tokenizer.json" || fail "prep's tokenizer.json is not the saved file"
m=$work/d1/dataset.textproto
grep -q "^vocab_size: 16384" "$m" || fail "manifest vocab: $(cat "$m")"
grep -q "^tokenizer_crc32c: [0-9]" "$m" || fail "the manifest does not seal the tokenizer: $(cat "$m")"
grep -q "^eot_token: 0" "$m" || fail "documents are not separated by <|endoftext|> (id 0): $(cat "$m")"
# The seal is the CRC-32C (Castagnoli) of the saved file's bytes.
crc=$(python3 -c '
import sys
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
crc = 0xFFFFFFFF
for byte in open(sys.argv[1], "rb").read():
    crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
print(crc ^ 0xFFFFFFFF)' "$tok")
grep -q "^tokenizer_crc32c: $crc\$" "$m" || fail "the seal is not the CRC-32C $crc of $tok: $(grep crc "$m")"
echo "linux_corpus_test: ok ($expected documents, $(grep -c . "$work/p.jsonl") in 0.1 MB)"
