#!/usr/bin/env python3
"""The longest function bodies in C++ sources, by lines from the line of the opening brace to the
line of the closing one (a lambda counts as part of the function it is written in).

    scripts/longest_functions.py [--top N] [--over LINES] PATH...   (directories: their .hpp/.ipp/.cpp/.cu/.cuh)

A heuristic, not a parser: comments, strings and preprocessor lines are skipped; a brace opens a
function when no function is open and the text before it since the last ';', '{' or '}' holds a
parenthesis and does not start with class, struct, union, enum, namespace or a control keyword.
Exits 1 when --over is given and a function is longer.
"""
import argparse
import os
import re
import sys

EXTS = (".hpp", ".ipp", ".cpp", ".cu", ".cuh", ".h")
NOT_FUNCTION = re.compile(r"^\s*(template\s*<.*>\s*)?(class|struct|union|enum|namespace|extern|if|for|while|switch|catch|do|else|try)\b")


def strip(text):
    """Comments, string and character literals blanked (newlines kept); preprocessor lines too."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines = "".join(out).split("\n")
    return "\n".join("" if l.lstrip().startswith("#") else l for l in lines)


def functions(path):
    text = strip(open(path, encoding="utf-8", errors="replace").read())
    depth, line, head = 0, 1, ""
    open_fn = None  # (depth at its brace, first line, head)
    found = []
    for c in text:
        if c == "\n":
            line += 1
            head += " "
        elif c == "{":
            if open_fn is None and "(" in head and not NOT_FUNCTION.match(head) and not head.rstrip().endswith("="):
                open_fn = (depth, line, " ".join(head.split())[-90:])
            depth += 1
            head = ""
        elif c == "}":
            depth -= 1
            if open_fn is not None and depth == open_fn[0]:
                found.append((line - open_fn[1] + 1, path, open_fn[1], open_fn[2]))
                open_fn = None
            head = ""
        elif c == ";":
            head = ""
        else:
            head += c
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--over", type=int, default=0)
    a = ap.parse_args()
    files = []
    for p in a.paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, f) for f in sorted(names) if f.endswith(EXTS)]
        else:
            files.append(p)
    found = sorted((f for path in files for f in functions(path)), reverse=True)
    for n, path, first, head in found[: a.top]:
        print(f"{n:5d}  {path}:{first}  {head}")
    if a.over and found and found[0][0] > a.over:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
