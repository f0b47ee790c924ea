#!/usr/bin/env python3
"""No function in src/ration longer than LIMIT lines. Functions already longer when this check was added
are listed in KNOWN with the length they had: such a function may shrink (update its entry, or remove it
once it is under the limit), never grow, and no new one may pass the limit. Prints every function over
the limit with its length.
Usage: check_function_length.py SRC_DIR
"""
import os
import re
import sys

LIMIT = 120
# "file:function" -> lines, as measured when the check was added. Empty: the planner's hot loops that were
# listed here now read as named steps.
KNOWN = {}

TOKEN = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|R"\((?:.|\n)*?\)"', re.S)


def strip(text):
    # Comments and literals become blanks of the same shape (newlines kept), so braces in them do not count.
    return TOKEN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def functions(text):
    """Yields (name, first line, last line) of every function body at namespace or class level."""
    code = strip(text)
    stack = []          # kinds of the open blocks: "ns", "class", "fn", "other"
    starts = []         # for "fn": (name, line)
    header_from = 0     # where the text before the next "{" starts
    for i, ch in enumerate(code):
        if ch in ";":
            if not stack or stack[-1] in ("ns", "class"):
                header_from = i + 1
        elif ch == "{":
            header = code[header_from:i]
            if stack and stack[-1] in ("fn", "other"):
                kind = "other"
            elif re.search(r"\bnamespace\b", header) or re.search(r'\bextern\s*$', header):
                kind = "ns"
            elif re.search(r"\b(class|struct|union|enum)\b", header) and "(" not in header.split("=")[0]:
                kind = "class"
            elif ")" in header and not re.search(r"=\s*$", header.strip()):
                kind = "fn"
            else:
                kind = "other"
            stack.append(kind)
            if kind == "fn":
                m = re.findall(r"([~\w:]+(?:<[^()]*>)?)\s*\(", header.split("->")[0])
                name = m[0] if m else "?"
                starts.append((name, code.count("\n", 0, i) + 1))
            header_from = i + 1
        elif ch == "}":
            kind = stack.pop() if stack else "other"
            if kind == "fn":
                name, first = starts.pop()
                yield name, first, code.count("\n", 0, i) + 1
            if not stack or stack[-1] in ("ns", "class"):
                header_from = i + 1


def main():
    src = sys.argv[1]
    problems, over = [], []
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if not f.endswith((".cpp", ".h")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            for name, first, last in functions(text):
                n = last - first + 1
                if n <= LIMIT:
                    continue
                key = f"{rel}:{name}"
                over.append((n, key, first))
                if key not in KNOWN:
                    problems.append(f"{rel}:{first}: {name} is {n} lines (limit {LIMIT}): split it")
                elif n > KNOWN[key]:
                    problems.append(f"{rel}:{first}: {name} grew to {n} lines (was {KNOWN[key]}; limit {LIMIT})")
    for n, key, first in sorted(over, reverse=True):
        print(f"{n:5d}  {key} (line {first})")
    for p in problems:
        print("FAIL:", p)
    print(f"{len(over)} functions over {LIMIT} lines ({len(over) - len(problems)} known), {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
