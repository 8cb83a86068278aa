#!/usr/bin/env python3
"""The longest functions of the product code (C++ and CUDA), by lines from the opening brace's line to the
closing brace's, lambdas inside counted with their function. A function is a top-level (or namespace- or
class-level) brace block whose header ends in ')' with optional qualifiers; data tables (initialiser
lists) are not functions.
usage: function_lengths.py [--max N] [--top K] [DIR ...]   (default: the product folders)
With --max, exits 1 when a function is longer than N lines, naming each."""
import argparse
import os
import re
import sys

PRODUCT = ["core", "costmodel", "planner", "executor", "vision", "text", "engine", "microbench", "oracle", "serve", "cli", "python"]
EXTS = (".h", ".cpp", ".cu", ".cuh")


def strip(text):
    """Comments, strings and character literals blanked, line structure kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j, n - 1) - i + 1))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


HEADER = re.compile(r"\)\s*(const|override|final|noexcept|mutable|->[^{;]*|:[^{;]*|\s)*$")
CONTAINER = re.compile(r"\b(namespace|class|struct|union|enum|extern\s+\"C\")\b[^;{]*$")


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    stack = []  # (kind, start line, name)
    line = 1
    last = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            head = text[last:i]
            head_tail = head[-400:]
            if stack and stack[-1][0] == "function":
                kind = "inner"
            elif CONTAINER.search(head_tail.split(";")[-1].split("}")[-1]):
                kind = "container"
            elif HEADER.search(head_tail.split(";")[-1].split("}")[-1]):
                kind = "function"
            else:
                kind = "other"
            name = re.findall(r"([A-Za-z_~][A-Za-z_0-9:<>~]*)\s*\(", head_tail)
            stack.append((kind, line, name[-1] if name else "?"))
            last = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    yield name, start, line - start + 1
            last = i + 1
        elif c == ";":
            last = i + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max", type=int, default=0)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("dirs", nargs="*", default=PRODUCT)
    a = ap.parse_args()
    rows = []
    for d in a.dirs:
        for root, _, files in os.walk(d):
            for f in files:
                if f.endswith(EXTS):
                    p = os.path.join(root, f)
                    rows += [(n, p, s, name) for name, s, n in functions(p)]
    rows.sort(reverse=True)
    for n, p, s, name in rows[: a.top]:
        print("%5d  %s:%d  %s" % (n, p, s, name))
    over = [r for r in rows if a.max and r[0] > a.max]
    print("%d functions, %d over %d lines" % (len(rows), len(over), a.max) if a.max else "%d functions" % len(rows))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
