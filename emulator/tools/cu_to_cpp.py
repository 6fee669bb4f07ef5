#!/usr/bin/env python3
"""Rewrites a CUDA source into the C++ the emulator compiles, changing only what g++ cannot read.

    cu_to_cpp.py IN.cu OUT.cpp

- `kernel<<<grid, block[, shared[, stream]]>>>(args)` becomes
  `::emu::rt::launch_kernel(::emu::rt::launch_args(grid, block, ...), "kernel", CALL, RESOLVE,
  args)`, CALL a lambda that calls `kernel(p...)` (so deduced template arguments deduce as
  before) and RESOLVE one that names the kernel's address where it can (emu/kernel_launch.h);
  the kernel expression may be qualified and carry template arguments.
- each `extern __shared__ T name[];` gets its definition, `MOD_EMU_DYNAMIC_SHARED(T, name)`, at
  the namespace scope that encloses the kernel declaring it (emulator/README.md says why).
- `#include "emulator/include/emu/cuda.h"` comes first, and `#line` keeps every line where it
  was in IN.cu, so compiler messages and debuggers point at the original.
"""
import os
import re
import sys


def code_mask(text):
    """True for each character that is code: not in a comment, string, char literal or
    preprocessor line (continuations included)."""
    mask = [True] * len(text)
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":
            j = i
            while j < n and not (text[j] == "\n" and text[j - 1] != "\\"):
                j += 1
            for k in range(i, j):
                mask[k] = False
            i = j
            continue
        line_start = c == "\n"
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                mask[k] = False
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                mask[k] = False
            i = j
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i, min(j + 1, n)):
                mask[k] = False
            i = j + 1
            continue
        i += 1
    return mask


def find_code(text, mask, needle, start):
    i = text.find(needle, start)
    while i >= 0 and not all(mask[i:i + len(needle)]):
        i = text.find(needle, i + 1)
    return i


def kernel_start(text, end):
    """Start of the kernel expression ending just before `end`: an identifier, possibly
    qualified (a::b) and followed by template arguments (k<T, f<U>>)."""
    i = end
    while i > 0 and text[i - 1].isspace():
        i -= 1
    while True:
        if i > 0 and text[i - 1] == ">":
            depth = 0
            while i > 0:
                i -= 1
                if text[i] == ">":
                    depth += 1
                elif text[i] == "<":
                    depth -= 1
                    if depth == 0:
                        break
            while i > 0 and text[i - 1].isspace():
                i -= 1
        j = i
        while j > 0 and (text[j - 1].isalnum() or text[j - 1] == "_"):
            j -= 1
        if j == i:
            raise SystemExit("cu_to_cpp: no kernel name before <<< at offset %d" % end)
        i = j
        if text[i - 2:i] == "::":
            i -= 2
            continue
        return i


def matching_paren(text, mask, open_at):
    depth = 0
    for i in range(open_at, len(text)):
        if not mask[i]:
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise SystemExit("cu_to_cpp: unbalanced parentheses after offset %d" % open_at)


def rewrite_launches(text):
    out, pos = [], 0
    while True:
        mask = code_mask(text)
        lt = find_code(text, mask, "<<<", pos)
        if lt < 0:
            return text
        gt = find_code(text, mask, ">>>", lt)
        start = kernel_start(text, lt)
        paren = gt + 3
        while text[paren].isspace():
            paren += 1
        if text[paren] != "(":
            raise SystemExit("cu_to_cpp: no argument list after >>> at offset %d" % gt)
        close = matching_paren(text, mask, paren)
        kernel = text[start:lt].strip()
        config = text[lt + 3:gt]
        args = text[paren + 1:close]
        name = re.sub(r"\s+", " ", kernel)
        new = ('::emu::rt::launch_kernel(::emu::rt::launch_args(%s), "%s", '
               '[=](const auto&... p) { %s(p...); }, '
               '[=]<class... ModEmuArgs>() -> const void* { if constexpr (requires { '
               'static_cast<void (*)(ModEmuArgs...)>(%s); }) return reinterpret_cast<const void*>('
               'static_cast<void (*)(ModEmuArgs...)>(%s)); else return nullptr; }%s)') % (
            config, name, kernel, kernel, kernel, (", " + args) if args.strip() else "")
        # Keep the line count: newlines dropped from between the pieces go after the call.
        lost = text[start:close + 1].count("\n") - new.count("\n")
        new += "\n" * max(lost, 0)
        text = text[:start] + new + text[close + 1:]
        pos = start + len(new)


SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w:\s]*?)\s+"
    r"(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_]\w*)\s*\[\s*\]")


def add_dynamic_shared(text):
    """Inserts MOD_EMU_DYNAMIC_SHARED(T, name) after the last namespace-scope boundary (a `;`,
    a `}` or a namespace's `{`) before each declaration, once per namespace and name."""
    mask = code_mask(text)
    stack, boundary, boundaries = [], 0, {}
    path_at = {}
    for i, c in enumerate(text):
        if not mask[i]:
            continue
        if c == "{":
            head = "".join(ch for k, ch in enumerate(text[max(0, i - 200):i])
                           if mask[max(0, i - 200) + k])
            m = re.search(r"namespace(\s+[\w:]+)?\s*$", head)
            stack.append(("ns", (m.group(1) or "").strip()) if m else ("code", ""))
        elif c == "}":
            if stack:
                stack.pop()
        if all(kind == "ns" for kind, _ in stack) and c in ";{}":
            boundary = i + 1
        boundaries[i] = boundary
        path_at[i] = tuple(name for _, name in stack)
    inserts, seen = [], set()
    for m in SHARED.finditer(text):
        if not mask[m.start()]:
            continue
        key_at = max(k for k in boundaries if k <= m.start())
        key = (path_at[key_at], m.group(2))
        if key in seen:
            continue
        seen.add(key)
        inserts.append((boundaries[key_at],
                        " MOD_EMU_DYNAMIC_SHARED(%s, %s)" % (" ".join(m.group(1).split()),
                                                             m.group(2))))
    for at, what in sorted(inserts, reverse=True):
        text = text[:at] + what + text[at:]
    return text


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    source, target = sys.argv[1], sys.argv[2]
    with open(source, encoding="utf-8") as f:
        text = f.read()
    text = add_dynamic_shared(rewrite_launches(text))
    header = ('// Generated by emulator/tools/cu_to_cpp.py from %s: edit that file, not this.\n'
              '#include "emulator/include/emu/cuda.h"\n#line 1 "%s"\n' % (source, source))
    with open(target + ".tmp", "w", encoding="utf-8") as f:
        f.write(header + text)
    os.replace(target + ".tmp", target)


if __name__ == "__main__":
    main()
