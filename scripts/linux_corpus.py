#!/usr/bin/env python3
"""The Linux kernel's sources and documentation as a corpus for `modtrain prep` (docs/grids.md,
"The Linux corpus"). Invariant: the output depends only on the tarball's contents and the
options, never on the machine, so every run (here, in CI, on a GPU machine) writes the same bytes.

Input: a kernel tree as a tarball, by default Debian's linux-source-6.1 package
(/usr/src/linux-source-6.1.tar.xz; `apt-get install linux-source-6.1`; no network after that).
Output: JSON Lines, one document per file, {"text": <the file>} (`modtrain prep --input F.jsonl`).

Selection, and why:
  - C sources and headers (*.c, *.h): most of the tree, the code a code model should learn;
  - Documentation and prose: *.rst, *.txt; build logic: Kconfig* and Makefile files;
  - not: device trees, YAML bindings, assembly, scripts, JSON tables (small shares, or data);
  - not files over --max-file-kb (256 KiB): these are generated tables (AMD's register headers
    run to 24 MB each, firmware blobs as C arrays); nor anything under asic_reg/ (generated
    register headers of every size: 300+ MB of #defines);
  - not binaries (a NUL byte) nor text that is not valid UTF-8.
Order: by the SHA-256 of each file's path inside the tree, a fixed shuffle, so that any prefix of
the output (--max-mb, or the part of it that gpu_corpus.sh packs) samples the whole tree rather
than its first directories. modtrain prep then holds out documents by index and seed (fixed).

Usage: scripts/linux_corpus.py --out corpus/linux.jsonl [--tarball T] [--max-mb N] [--stats]
"""
import argparse
import hashlib
import json
import re
import sys
import tarfile

SUFFIXES = (".c", ".h", ".rst", ".txt")
NAME_RE = re.compile(r"^(Kconfig.*|Makefile)$")


def selected(path, size, max_file_bytes):
    """Whether a member path (inside the tree's top directory) is taken, by name and size."""
    name = path.rsplit("/", 1)[-1]
    if not (name.endswith(SUFFIXES) or NAME_RE.match(name)):
        return False
    if "/asic_reg/" in "/" + path:
        return False
    return size <= max_file_bytes


def tree_path(member_name):
    """linux-source-6.1/kernel/fork.c -> kernel/fork.c: the order does not depend on the top dir."""
    return member_name.split("/", 1)[1] if "/" in member_name else member_name


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tarball", default="/usr/src/linux-source-6.1.tar.xz")
    ap.add_argument("--out", required=True, help="the JSON Lines file to write")
    ap.add_argument("--max-mb", type=float, default=0,
                    help="stop before the text exceeds this many MB (1e6 bytes); 0: everything")
    ap.add_argument("--max-file-kb", type=int, default=256, help="larger files are skipped (KiB)")
    args = ap.parse_args()
    max_file = args.max_file_kb * 1024

    # One pass over the tarball, keeping the selected files' bytes; the order is decided after.
    files = {}
    skipped = {"binary": 0, "not utf-8": 0}
    with tarfile.open(args.tarball, "r:*") as tar:
        for m in tar:
            if not m.isfile():
                continue
            path = tree_path(m.name)
            if not selected(path, m.size, max_file):
                continue
            data = tar.extractfile(m).read()
            if b"\0" in data:
                skipped["binary"] += 1
                continue
            try:
                files[path] = data.decode("utf-8")
            except UnicodeDecodeError:
                skipped["not utf-8"] += 1

    order = sorted(files, key=lambda p: (hashlib.sha256(p.encode()).digest(), p))
    limit = int(args.max_mb * 1e6) if args.max_mb > 0 else None
    written = text_bytes = 0
    kinds = {}
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for path in order:
            text = files[path]
            n = len(text.encode("utf-8"))
            if limit is not None and text_bytes + n > limit:
                break
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            written += 1
            text_bytes += n
            name = path.rsplit("/", 1)[-1]
            kind = name.rsplit(".", 1)[-1] if "." in name and not NAME_RE.match(name) else name.split(".")[0]
            kinds[kind] = kinds.get(kind, 0) + n
    by_kind = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
    print(f"linux_corpus: {args.out}: {written} files, {text_bytes / 1e6:.1f} MB of text "
          f"(of {len(files)} selected; skipped {skipped['binary']} binary, "
          f"{skipped['not utf-8']} not UTF-8); MB by kind: {by_kind}")


if __name__ == "__main__":
    sys.exit(main())
