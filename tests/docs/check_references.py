#!/usr/bin/env python3
"""Checks that what the docs and comments cite exists: file paths, code names, links, config fields.

- A path cited in README.md, docs/, configs/ or a source file's comments (a token with a '/' and
  a source or doc extension, e.g. core/op_catalogue.h) exists relative to the repository root or
  to the citing file.
- A code name in a doc's backticks (snake_case, or a CTest name such as
  unit:layers_include_graph) occurs in some code file.
- A relative Markdown link reaches a file and, with #anchor, one of its headings.
- A run-config field cited as `--set a.b=...` or in backticks (`train.cuda_graph`,
  `model.mod.capacity: 0.25`) is a field path of configs/modtrain.proto.
- Every op family's header (core/ops/*.h) has a "Tested by:" line.
Exit 1 and one line per dangling citation, naming file:line.

Usage: check_references.py REPO_ROOT
"""
import pathlib
import re
import subprocess
import sys

EXTENSIONS = ("h", "cpp", "cu", "cuh", "py", "sh", "proto", "textproto", "md", "txt", "png")
PATH_RE = re.compile(
    r"(?<![\w/.$<{-])((?:\.\./)?[A-Za-z_][\w.-]*(?:/[\w.-]+)+\.(?:%s))(?![\w/])"
    % "|".join(EXTENSIONS))
# Citations that name something outside the tree on purpose: outputs, other projects, examples.
NOT_OURS = re.compile(
    r"^(build[\w-]*|runs|data|out|/|\.\./shared|llm\.c|llmc|dev|train_gpt2|"
    r"ggml|flashlight|fl|torchtitan|cutlass|tensorflow|include|usr|tmp|examples?|my_?\w*|"
    r"[A-Z][A-Z_]*)(/|$)")  # an upper-case first part is a placeholder: OUT/points/P.textproto
COMMENT_RE = {
    ".h": r"//(.*)", ".cpp": r"//(.*)", ".cu": r"//(.*)", ".proto": r"//(.*)",
    ".py": r"#(.*)", ".sh": r"#(.*)", ".txt": r"#(.*)", ".textproto": r"#(.*)",
}
# A code name cited in backticks in a doc (snake_case with an underscore, or a CTest name
# label:name) must occur in the tracked code; these are other programs' names or examples.
IDENT_RE = re.compile(r"`(?:\w+:)?([A-Za-z_]\w*_\w*)(?:\(\))?`")
NOT_OUR_NAMES = re.compile(
    r"^(avx512_\w+|BLIS_\w+|ONEDNN_\w+|NCCL_\w+|SRUN_\w+|SLURM_\w+|OMPI_\w+|DT_NEEDED|"
    r"DYNAMIC_ARCH|odls_\w+|thp_\w+|sgemm_beta_\w+|x_BTD|snake_case|MOD_|r_i|_\w+|"
    r"b\d+e\d+_\w+)$")
CONFIG_ROOTS = ("model", "optimizer", "train", "data", "parallel", "checkpoint")
FILE_SUFFIXES = {"safetensors", "bin", "csv", "textproto", "json", "txt", "png", "html", "log"}
FIELD_RE = re.compile(r"(?:--set[ =]|`)((?:%s)\.[a-z_][\w.]*)" % "|".join(CONFIG_ROOTS))


def proto_fields(proto_text):
    """message name -> {field name: type name}, nested messages flattened by their short name."""
    messages, stack = {}, []
    for line in proto_text.splitlines():
        line = line.split("//")[0]
        m = re.match(r"\s*(message|enum)\s+(\w+)\s*{", line)
        if m:
            stack.append(m.group(2) if m.group(1) == "message" else None)
            if m.group(1) == "message":
                messages.setdefault(m.group(2), {})
            continue
        m = re.match(r"\s*(?:optional|repeated|required)\s+([\w.]+)\s+(\w+)\s*=", line)
        if m and stack and stack[-1]:
            messages[stack[-1]][m.group(2)] = m.group(1).split(".")[-1]
        if "}" in line and stack:
            stack.pop()
    return messages


def field_exists(messages, dotted):
    message = "RunConfig"
    for part in dotted.split("."):
        fields = messages.get(message)
        if fields is None or part not in fields:
            return False
        message = fields[part]
    return True


LINK_RE = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path, cache={}):
    if path not in cache:
        cache[path] = {anchor(m.group(1)) for m in
                       re.finditer(r"^#+\s+(.*)$", path.read_text(errors="replace"), re.M)}
    return cache[path]


def link_problem(doc, target):
    """Why a relative Markdown link from doc does not resolve, or None."""
    if re.match(r"^[a-z]+:", target):
        return None  # http:, https:, mailto:
    file_part, _, fragment = target.partition("#")
    linked = (doc.parent / file_part).resolve() if file_part else doc
    if not linked.exists():
        return f"links to {target}, which does not exist"
    if fragment and linked.suffix == ".md" and fragment not in anchors_of(linked):
        return f"links to {target}, but {linked.name} has no heading with that anchor"
    return None


def cited_text(path):
    """(line number, text) pairs where citations count: all of a doc, comments of code."""
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if path.suffix == ".md" or path.parent.name in ("recipes", "grids"):
        return list(enumerate(text, 1))
    pattern = COMMENT_RE.get(path.suffix) or ("#(.*)" if path.name == "CMakeLists.txt" else None)
    if pattern is None:
        return []
    out = []
    for number, line in enumerate(text, 1):
        m = re.search(pattern, line)
        if m:
            out.append((number, m.group(1)))
    return out


def main(root):
    root = pathlib.Path(root).resolve()
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    tracked = listed.stdout.split() if listed.returncode == 0 else [
        str(p.relative_to(root)) for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(("build", ".")) for part in p.relative_to(root).parts)]
    messages = proto_fields((root / "configs/modtrain.proto").read_text())
    code_words = set()
    for name in tracked:
        if not name.endswith(".md") and (root / name).is_file():
            code_words.update(re.findall(r"\w+", (root / name).read_text(errors="replace")))
    problems = []
    for name in tracked:
        path = root / name
        if name.startswith("tests/fuzz/") and "/corpus/" in name or "/regressions/" in name:
            continue  # hostile inputs, not prose
        if not path.is_file():
            continue
        for number, line in cited_text(path):
            for cited in PATH_RE.findall(line):
                if NOT_OURS.match(cited) or any(c in cited for c in "*<>{}$"):
                    continue
                if not ((root / cited).exists() or (path.parent / cited).exists()):
                    problems.append(f"{name}:{number}: cites {cited}, which does not exist")
            if path.suffix == ".md":
                for target in LINK_RE.findall(line):
                    why = link_problem(path, target)
                    if why:
                        problems.append(f"{name}:{number}: {why}")
                for ident in IDENT_RE.findall(line):
                    if ident not in code_words and not NOT_OUR_NAMES.match(ident):
                        problems.append(f"{name}:{number}: cites {ident}, which no code file has")
            if path.suffix == ".md" or path.suffix in COMMENT_RE:
                for dotted in FIELD_RE.findall(line):
                    dotted = dotted.rstrip(".")
                    if dotted.rsplit(".", 1)[-1] in FILE_SUFFIXES:
                        continue  # a file name such as model.safetensors or train.bin
                    if not field_exists(messages, dotted):
                        problems.append(f"{name}:{number}: cites config field {dotted}, "
                                        "which configs/modtrain.proto does not have")
    # Every op family's header names the tests that check it (the paths are checked above).
    for header in sorted((root / "core/ops").glob("*.h")):
        text = header.read_text()
        if "Tested by:" not in text and header.name != "check.h":
            problems.append(f"core/ops/{header.name}: no 'Tested by:' line naming its tests")
    for p in problems:
        print(p)
    print(f"check_references: {len(problems)} dangling citation(s) in {len(tracked)} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
