#!/usr/bin/env python3
"""Finds import circles between the modules of each Rust crate.

A module is one file (`src/a/b.rs` or `src/a/b/mod.rs` is `a::b`) or an
inline `mod name { … }` of one; an edge M -> N means M names an item of N
(`use crate::n::Item`, `super::n::f()`, `n::f()` of a module M declares, a
name that a glob `use n::*` brings in and M writes). Declaring a child
module (`mod n;`) is not an edge, nor is re-exporting an item (`pub use
n::Item`) that the module does not write itself: that is part of its
public face, not a use.

A path is followed to the module its item lives in, through every
re-export and import on the way: `crate::m::Item` where `m` does `pub use
state::Item`, `super::Item` or `super::*` through a parent's `use`, and a
`pub use` of such a path all lead to the module that defines `Item` (a path
that ends in another crate leads to the last module of this one it passes).
When the module the item lives in is private (`mod state;`, not `pub mod
state;`) and the module naming it is outside its parent, there is an edge
to that parent as well: nothing outside the parent can name the private
module, the item reaches them only through the parent's re-export, so
moving a type into a private file of a directory module (`m/state.rs`,
re-exported by `m/mod.rs`) does not make its users independent of `m`.

Every strongly connected component of more than one module is a circle: the
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

# Comments and literals in one pass: whichever begins first wins, so that
# `//` inside a string (a URL) is not a comment and a quote inside a comment
# does not open a string.
_COMMENT_OR_STRING = re.compile(
    r"//[^\n]*|/\*.*?\*/"
    r'|b?r#*"(?:[^"\\]|\\.)*"#*|b?"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)\'',
    re.S,
)
_MOD_DECL = re.compile(r"\bmod\s+([a-z_][a-z0-9_]*)\s*([;{])")
# A visibility right before a declaration (looked for backwards from it).
_PUB_BEFORE = re.compile(r"\bpub\s*(?:\(\s*([^)]*?)\s*\))?\s*$")
_PATH = re.compile(r"(?<![A-Za-z0-9_:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:\s*::\s*(?:[A-Za-z_][A-Za-z0-9_]*|\{))+)")
_USE = re.compile(r"\buse\s+([^;]+);")
# Names a module defines (a keyword stays out of the match, so that
# `const fn f` yields both `fn` and `f`).
_DEFINED = re.compile(
    r"\b(?:struct|enum|union|trait|type|fn|const|static)\s+(?:mut\s+)?(?=([A-Za-z_][A-Za-z0-9_]*))"
    r"|\bmacro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)"
)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Module:
    path: tuple[str, ...]
    file: Path
    # As its parent declares it: "pub" (also `pub(crate)`), "super" or "private".
    visibility: str = "pub"
    children: set[str] = field(default_factory=set)
    # Text that belongs to this module only (inline children cut out).
    text: str = ""
    # Every name a `use` brings in (re-exported or not), with its path.
    imports: dict[str, list[str]] = field(default_factory=dict)
    # The paths of its glob imports (`use path::*`).
    globs: list[list[str]] = field(default_factory=list)
    # Names of the items it defines.
    defined: set[str] = field(default_factory=set)


def shown(path: Path) -> str:
    """A path relative to the repository when it is inside it."""
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def blank(text: str) -> str:
    """Spaces for every character but line ends."""
    return "\n".join(" " * len(line) for line in text.split("\n"))


def strip(text: str) -> str:
    """Blanks comments and string literals, keeping line numbers."""
    return _COMMENT_OR_STRING.sub(lambda m: blank(m.group(0)), text)


def pub_before(text: str, at: int) -> bool:
    """Whether the declaration at `at` is a `pub` one of any kind."""
    return _PUB_BEFORE.search(text, max(0, at - 64), at) is not None


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


def visibility(text: str, at: int) -> str:
    """The visibility of the module declared at `at`: who outside its
    parent may name it."""
    m = _PUB_BEFORE.search(text, max(0, at - 64), at)
    if m is None or m.group(1) == "self":
        return "private"
    if m.group(1) == "super":
        return "super"
    return "pub"  # `pub`, `pub(crate)`, and (loosely) `pub(in path)`


def load_crate(src: Path, root_file: Path) -> dict[tuple[str, ...], Module]:
    modules: dict[tuple[str, ...], Module] = {}

    def visit(path: tuple[str, ...], file: Path, text: str, dir_for_children: Path, vis: str) -> None:
        module = Module(path, file, vis)
        modules[path] = module
        own = list(text)
        for m in list(_MOD_DECL.finditer(text)):
            name = m.group(1)
            # Skip declarations inside an inline child already cut out.
            if "".join(own[m.start():m.end()]).strip() == "":
                continue
            module.children.add(name)
            child_vis = visibility(text, m.start())
            if m.group(2) == "{":
                end = matching_brace(text, m.end() - 1)
                inner = text[m.end():end]
                # Keep the lines but blank the child's text in the parent.
                own[m.start():end + 1] = blank("".join(own[m.start():end + 1]))
                # The child sees blanks before its body, so its line numbers hold.
                before = blank(text[: m.end()])
                visit(path + (name,), file, before + inner, dir_for_children / name, child_vis)
            else:
                for candidate in (dir_for_children / f"{name}.rs", dir_for_children / name / "mod.rs"):
                    if candidate.is_file():
                        child_text = strip(candidate.read_text())
                        visit(path + (name,), candidate, child_text, dir_for_children / name, child_vis)
                        break
        module.text = "".join(own)
        for m in _USE.finditer(module.text):
            for segs, visible, glob in expand_use(m.group(1)):
                if glob:
                    module.globs.append(segs)
                elif segs and visible != "_":
                    module.imports[visible] = segs
        for m in _DEFINED.finditer(module.text):
            module.defined.add(m.group(1) or m.group(2))

    root_text = strip(root_file.read_text())
    visit((), root_file, root_text, src if root_file.name in ("lib.rs", "main.rs", "mod.rs") else src / root_file.stem, "pub")
    return modules


# (module, exact): the module an item lives in, and whether the path names
# that module itself rather than an item of it.
Found = tuple[tuple[str, ...], bool]


class Resolver:
    """Follows paths and names of one crate to the modules their items live in."""

    def __init__(self, modules: dict[tuple[str, ...], Module]):
        self.modules = modules
        # (module, name) -> where it leads; None while being looked up, so
        # that imports naming each other end instead of looping.
        self.names: dict[tuple[tuple[str, ...], str], Found | None] = {}

    def resolve(self, here: tuple[str, ...], segments: list[str]) -> Found | None:
        """Where the item a path written in `here` lives, or None for
        another crate's path."""
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
                if not base:
                    return None
                base = base[:-1]
                if not rest:
                    return base, True
                head, rest = rest[0], rest[1:]
            rest = [head] + rest
        else:
            found = self.lookup(here, head)
            if found is None or not found[1]:
                return found  # another crate's, or an item (what follows is its member)
            base = found[0]
        for seg in rest:
            found = self.lookup(base, seg)
            if found is None:
                return base, False  # an item of `base` not seen (made by a macro)
            if not found[1]:
                return found
            base = found[0]
        return base, True

    def lookup(self, at: tuple[str, ...], name: str) -> Found | None:
        """Where the name `name` in module `at` leads: a child module, an
        import (followed to the end), an item of its own, or a name one of
        its globs brings in; None if `at` has no such name."""
        key = (at, name)
        if key in self.names:
            return self.names[key]
        self.names[key] = None
        module = self.modules[at]
        found: Found | None = None
        if name in module.children and at + (name,) in self.modules:
            found = (at + (name,), True)
        elif name in module.imports:
            found = self.resolve(at, module.imports[name])
        elif name in module.defined:
            found = (at, False)
        else:
            for source in self.glob_sources(at):
                found = self.lookup(source, name)
                if found is not None:
                    break
        self.names[key] = found
        return found

    def glob_sources(self, at: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The modules of this crate whose names `at` brings in with globs."""
        out = []
        for segs in self.modules[at].globs:
            found = self.resolve(at, segs)
            if found is not None and found[1] and found[0] != at:
                out.append(found[0])
        return out

    def offered(self, source: tuple[str, ...]) -> dict[str, Found]:
        """The names a glob import of `source` brings in besides the items
        `source` defines: its child modules, imports and what its own globs
        bring in, each with where it leads."""
        out: dict[str, Found] = {}
        seen: set[tuple[str, ...]] = set()
        todo = [source]
        while todo:
            at = todo.pop()
            if at in seen:
                continue
            seen.add(at)
            module = self.modules[at]
            for name in module.children | set(module.imports):
                found = self.lookup(at, name)
                if found is not None:
                    out.setdefault(name, found)
            todo.extend(self.glob_sources(at))
        return out

    def targets(self, user: tuple[str, ...], home: tuple[str, ...]) -> list[tuple[str, ...]]:
        """The modules `user` depends on for an item of `home`: `home`, and
        the parent of the first module on the way there that `user` cannot
        name (a private module, to everyone outside its parent): only that
        parent lets the item out, so `user` depends on it as well."""
        for i in range(1, len(home) + 1):
            parent = home[: i - 1]
            vis = self.modules[home[:i]].visibility
            if vis == "private" and user[: len(parent)] != parent:
                return [parent, home]
            if vis == "super" and parent and user[: len(parent) - 1] != parent[:-1]:
                return [parent, home]
        return [home]


def expand_use(tree: str) -> list[tuple[list[str], str, bool]]:
    """`a::{b, c::{d as e}, f::*}` -> [([a, b], b, False), ([a, c, d], e, False),
    ([a, f], "", True)]: each path, the name it is visible under, and
    whether it is a glob."""
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree.strip())
    tree = re.sub(r"\s+", " ", tree)
    out: list[tuple[list[str], str, bool]] = []

    def walk(prefix: list[str], s: str) -> None:
        if "{" not in s:
            name, _, alias = s.partition(" as ")
            parts = [p for p in name.split("::") if p]
            glob = bool(parts) and parts[-1] == "*"
            segs = prefix + [p for p in parts if p not in ("self", "*")]
            visible = "" if glob else (alias.strip() or (segs[-1] if segs else ""))
            out.append((segs, visible, glob))
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


def edges_of(modules) -> dict[tuple[str, ...], dict[tuple[str, ...], str]]:
    resolver = Resolver(modules)
    edges: dict[tuple[str, ...], dict[tuple[str, ...], str]] = {p: {} for p in modules}
    for path, module in modules.items():
        text = module.text

        def add(found: Found | None, pos: int) -> None:
            # A module's own children and ancestors count: only the
            # declaration itself is not an edge.
            if found is None:
                return
            for target in resolver.targets(path, found[0]):
                if target != path:
                    line = text.count("\n", 0, pos) + 1
                    edges[path].setdefault(target, f"{shown(module.file)}:{line}")

        uses = list(_USE.finditer(text))
        # The names the module writes in its own code.
        written = set(_WORD.findall(_USE.sub(" ", text)))
        for m in uses:
            # A re-export alone is part of the module's face, not a use; a
            # name it brings in that the module writes is one.
            reexport = pub_before(text, m.start())
            for segs, visible, glob in expand_use(m.group(1)):
                found = resolver.resolve(path, segs)
                if not glob or found is None or not found[1]:
                    if not reexport or visible in written:
                        add(found, m.start())
                    continue
                source = found[0]
                if not reexport or modules[source].defined & written:
                    add(found, m.start())
                # A glob also brings in what its source imports: each name
                # the module writes leads to where it lives.
                for name, there in resolver.offered(source).items():
                    if name in written:
                        add(there, m.start())
        # Paths outside `use` declarations (those are counted with them).
        for m in _PATH.finditer(_USE.sub(lambda u: blank(u.group(0)), text)):
            segs = [s.strip() for s in m.group(1).split("::") if s.strip() and s.strip() != "{"]
            add(resolver.resolve(path, segs), m.start())
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
