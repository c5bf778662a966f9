#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit (default 100 lines, from
the `fn` line to its closing brace), so that the control plane's operations
stay readable as steps: each step a function of its own.

Comments and string literals are blanked first, so braces inside them do
not count; a function declared without a body (`fn f();`) is skipped.

Usage: tools/function_length.py [--max N] FILE_OR_DIR...
Exit status 1 when a function is longer than N lines; each is printed as
`LINES path:line name`.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# One pass over both, so that `//` inside a string is not a comment and a
# quote inside a comment is not a string: whichever starts first wins.
_COMMENT_OR_STRING = re.compile(
    r'//[^\n]*|/\*.*?\*/|b?r#*"(?:[^"\\]|\\.)*"#*|b?"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)\'', re.S)
_FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def blank(text: str) -> str:
    """Comments and string literals as spaces, keeping line numbers."""
    keep_lines = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return _COMMENT_OR_STRING.sub(keep_lines, text)


def functions(text: str) -> list[tuple[str, int, int]]:
    """Every function with a body: (name, first line, number of lines)."""
    text = blank(text)
    found = []
    for m in _FN.finditer(text):
        # The body opens at the first `{` before any `;` (a declaration has none).
        i = m.end()
        while i < len(text) and text[i] not in "{;":
            i += 1
        if i >= len(text) or text[i] == ";":
            continue
        depth, j = 0, i
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, j) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def rust_files(paths: list[Path]) -> list[Path]:
    files = []
    for p in paths:
        files += sorted(p.rglob("*.rs")) if p.is_dir() else [p]
    return files


def too_long(paths: list[Path], limit: int) -> list[str]:
    """`LINES path:line name` of each function over `limit` lines."""
    return [f"{n:5d} {f}:{line} {name}" for f in rust_files(paths)
            for name, line, n in functions(f.read_text()) if n > limit]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max", type=int, default=100)
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args()
    found = too_long(args.paths, args.max)
    print("\n".join(found) if found else f"no function over {args.max} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
