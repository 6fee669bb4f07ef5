#!/usr/bin/env python3
"""Checks the include graph against the layer order drawn in docs/architecture.md.

The layers are the top-level folders, bottom to top: a file may include headers of its own layer
and of layers below it, never above. The order is read from the diagram between the
`<!-- layers -->` markers in docs/architecture.md (one `folder/` per line, top layer first), so
the picture a newcomer reads is the rule this test enforces. Inside core/, the CPU and CUDA
backends never include each other (the device registry, core/backend_registry.cpp, joins them).

  check_layers.py SOURCE_DIR           exit 1 and list every offending #include
  check_layers.py SOURCE_DIR --dot     print the folder-level include graph as Graphviz DOT
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
SOURCES = ("*.h", "*.cpp", "*.cu", "*.cuh")
# (folder, folder it must not include): siblings inside a layer that stay apart.
APART = [("core/cpu", "core/cuda"), ("core/cuda", "core/cpu")]


def layer_order(root):
    doc = (root / "docs/architecture.md").read_text()
    m = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", doc, re.S)
    if not m:
        sys.exit("check_layers: docs/architecture.md has no <!-- layers --> diagram")
    top_first = re.findall(r"^\W*([a-z]+)/", m.group(1), re.M)
    if len(top_first) != len(set(top_first)) or not top_first:
        sys.exit(f"check_layers: the diagram lists layers {top_first}: each once, at least one")
    return list(reversed(top_first))


def includes(root, layers):
    """Yields (file, line number, included path) for every quoted include in a layer's sources."""
    for layer in layers:
        for pattern in SOURCES:
            for path in sorted((root / layer).rglob(pattern)):
                text = path.read_text(errors="replace")
                for m in INCLUDE.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    yield path.relative_to(root).as_posix(), line, m.group(1)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    root = pathlib.Path(sys.argv[1]).resolve()
    layers = layer_order(root)
    rank = {name: i for i, name in enumerate(layers)}
    missing = [name for name in layers if not (root / name).is_dir()]
    if missing:
        sys.exit(f"check_layers: the diagram names {missing}, which are not folders of {root}")

    bad, edges, count = [], set(), 0
    for src, line, inc in includes(root, layers):
        count += 1
        top = inc.split("/", 1)[0]
        if top not in rank:
            continue  # a header beside the file, or generated protobuf code of configs/
        here = src.split("/", 1)[0]
        edges.add((here, top))
        if rank[top] > rank[here]:
            bad.append(f"{src}:{line}: includes {inc}: {top}/ is above {here}/")
        for folder, banned in APART:
            if src.startswith(folder + "/") and inc.startswith(banned + "/"):
                bad.append(f"{src}:{line}: includes {inc}: {folder}/ and {banned}/ stay apart")

    if "--dot" in sys.argv:
        print("digraph layers {\n  rankdir=TB; node [shape=box, fontname=Helvetica];")
        for a, b in sorted(edges):
            if a != b:
                print(f'  "{a}/" -> "{b}/";')
        print("}")
        return 0
    if bad:
        print("check_layers: includes against the layer order "
              f"({' < '.join(layers)}):\n  " + "\n  ".join(bad))
        return 1
    print(f"check_layers: {count} includes in {len(layers)} layers "
          f"({' < '.join(layers)}) follow the order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
