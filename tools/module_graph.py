#!/usr/bin/env python3
"""Finds import circles between the modules of each Rust crate.

A module is one file (`src/a/b.rs` or `src/a/b/mod.rs` is `a::b`) or an
inline `mod name { … }` of one; an edge M -> N means M names an item of N
(`use crate::n::Item`, `super::n::f()`, `n::f()` of a module M declares).
Declaring a child module (`mod n;`) and re-exporting an item (`pub use`)
are not edges: a re-export is part of the module's public face, not a use;
a path through a re-export leads to the module the item lives in. Every
strongly connected component of more than one module is a circle: the
modules in it cannot be understood, tested or moved one at a time.

Usage: tools/module_graph.py [CRATE_DIR...]   (default: every workspace crate)
Exit status 1 when a circle exists; each circle is printed with one edge per
line and where it is written.
"""
from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'b?r#*"(?:[^"\\]|\\.)*"#*|b?"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)\'', re.S)
_MOD_DECL = re.compile(r"\bmod\s+([a-z_][a-z0-9_]*)\s*([;{])")
_PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*|\{))+)")
_USE = re.compile(r"(\bpub(?:\([a-z]+\))?\s+)?\buse\s+([^;]+);")


@dataclass
class Module:
    path: tuple[str, ...]
    file: Path
    children: set[str] = field(default_factory=set)
    # Text that belongs to this module only (inline children cut out).
    text: str = ""
    # Items it re-exports (`pub use child::Item`), by name, as paths.
    reexports: dict[str, list[str]] = field(default_factory=dict)


def shown(path: Path) -> str:
    """A path relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def strip(text: str) -> str:
    """Blanks comments and string literals, keeping line numbers."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return _STRING.sub(blank, _COMMENT.sub(blank, text))


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(text) - 1


def load_crate(src: Path, root_file: Path) -> dict[tuple[str, ...], Module]:
    modules: dict[tuple[str, ...], Module] = {}

    def visit(path: tuple[str, ...], file: Path, text: str, dir_for_children: Path) -> None:
        module = Module(path, file)
        modules[path] = module
        own = list(text)
        for m in list(_MOD_DECL.finditer(text)):
            name = m.group(1)
            # Skip declarations inside an inline child already cut out.
            if "".join(own[m.start():m.end()]).strip() == "":
                continue
            module.children.add(name)
            if m.group(2) == "{":
                end = matching_brace(text, m.end() - 1)
                inner = text[m.end():end]
                # Keep the lines but blank the child's text in the parent.
                for i in range(m.start(), end + 1):
                    if own[i] != "\n":
                        own[i] = " "
                # The child sees blanks before its body, so its line numbers hold.
                before = re.sub(r"[^\n]", " ", text[: m.end()])
                visit(path + (name,), file, before + inner, dir_for_children / name)
            else:
                for candidate in (dir_for_children / f"{name}.rs", dir_for_children / name / "mod.rs"):
                    if candidate.is_file():
                        child_text = strip(candidate.read_text())
                        visit(path + (name,), candidate, child_text, dir_for_children / name)
                        break
        module.text = "".join(own)

    root_text = strip(root_file.read_text())
    visit((), root_file, root_text, src if root_file.name in ("lib.rs", "main.rs", "mod.rs") else src / root_file.stem)
    return modules


def resolve(modules, here: tuple[str, ...], segments: list[str], depth: int = 0) -> tuple[str, ...] | None:
    """The deepest module a path names, or None for another crate's path."""
    if not segments:
        return None
    head, rest = segments[0], segments[1:]
    if head == "crate":
        base: tuple[str, ...] = ()
    elif head == "self":
        base = here
    elif head == "super":
        base = here
        while head == "super":
            base = base[:-1]
            if not rest:
                return base
            head, rest = rest[0], rest[1:]
        rest = [head] + rest
    elif head in modules[here].children:
        base, rest = here + (head,), rest
    else:
        return None
    for i, seg in enumerate(rest):
        if base + (seg,) in modules:
            base = base + (seg,)
            continue
        # An item the module re-exports: the edge goes to where it lives.
        target = modules[base].reexports.get(seg)
        if target is not None and depth < 8:
            return resolve(modules, base, target + rest[i + 1:], depth + 1)
        break
    return base


def expand_use(tree: str) -> list[tuple[list[str], str]]:
    """`a::{b, c::{d as e}}` -> [([a, b], b), ([a, c, d], e)]: each path and
    the name it is visible under."""
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree.strip())
    tree = re.sub(r"\s+", " ", tree)
    out: list[tuple[list[str], str]] = []

    def walk(prefix: list[str], s: str) -> None:
        if "{" not in s:
            name, _, alias = s.partition(" as ")
            segs = [p for p in name.split("::") if p and p != "*"]
            segs = prefix + [p for p in segs if p != "self"]
            visible = alias.strip() or (segs[-1] if segs else "")
            out.append((segs, visible))
            return
        i = s.index("{")
        head = [p for p in s[:i].split("::") if p]
        inner = s[i + 1:s.rindex("}")]
        depth, start = 0, 0
        for j, ch in enumerate(inner + ","):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                part = inner[start:j]
                if part:
                    walk(prefix + head, part)
                start = j + 1

    walk([], tree)
    return out


def note_reexports(modules) -> None:
    for module in modules.values():
        for m in _USE.finditer(module.text):
            if not m.group(1):
                continue
            for segs, visible in expand_use(m.group(2)):
                if segs and visible != "_":
                    module.reexports[visible] = segs


def edges_of(modules) -> dict[tuple[str, ...], dict[tuple[str, ...], str]]:
    note_reexports(modules)
    edges: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {p: {} for p in modules}
    for path, module in modules.items():
        text = module.text

        def add(target, pos):
            # A module's own children and ancestors count: only the
            # declaration itself is not an edge.
            if target is None or target == path:
                return
            line = text.count("\n", 0, pos) + 1
            edges[path].setdefault(target, f"{shown(module.file)}:{line}")

        in_use = []
        for m in _USE.finditer(text):
            in_use.append((m.start(), m.end()))
            if m.group(1):
                # A re-export names a child's item in the parent's facade; the
                # parent does not use it.
                continue
            for segs, _ in expand_use(m.group(2)):
                add(resolve(modules, path, segs), m.start())
        for m in _PATH.finditer(text):
            if any(start <= m.start() < end for start, end in in_use):
                continue  # counted with its `use`
            segs = [s.strip() for s in m.group(1).split("::") if s.strip() and s.strip() != "{"]
            add(resolve(modules, path, segs), m.start())
    return edges


def circles(edges) -> list[list[tuple[str, ...]]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    out = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            connect(v)
    return out


def crate_roots(crate_dir: Path) -> list[Path]:
    roots = []
    for name in ("src/lib.rs", "src/main.rs"):
        if (crate_dir / name).is_file():
            roots.append(crate_dir / name)
    return roots


def workspace_crates() -> list[Path]:
    manifest = tomllib.loads((REPO / "Cargo.toml").read_text())
    return [REPO / m for m in manifest["workspace"]["members"]]


def check(crate_dirs: list[Path]) -> list[str]:
    """One report line block per circle found."""
    reports = []
    for crate_dir in crate_dirs:
        for root in crate_roots(crate_dir):
            modules = load_crate(root.parent, root)
            edges = edges_of(modules)
            for comp in circles(edges):
                name = lambda p: "::".join(("crate",) + p)
                members = set(comp)
                lines = [f"{shown(root)}: circle of {len(comp)} modules: " + ", ".join(map(name, comp))]
                for a in comp:
                    for b, where in sorted(edges[a].items()):
                        if b in members:
                            lines.append(f"  {name(a)} -> {name(b)}  ({where})")
                reports.append("\n".join(lines))
    return reports


def main(argv: list[str]) -> int:
    dirs = [Path(a).resolve() for a in argv] or workspace_crates()
    reports = check(dirs)
    for r in reports:
        print(r)
    if reports:
        return 1
    print(f"no import circles in {len(dirs)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
