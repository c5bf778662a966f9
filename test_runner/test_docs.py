"""The documentation keeps up with what it describes, where a machine can
tell, without building or starting anything:

- the README's minimum Rust version ("a Rust toolchain (X.Y or newer") is
  Cargo's `rust-version` (`[workspace.package]` in `Cargo.toml`);
- `docs/architecture.md` names every crate of the workspace (`members` in
  `Cargo.toml`), each in inline code by its directory (`tools/faultfs/`)
  or its package name (`strata-faultfs`);
- every entry of `docs/decisions.md` says what would make us revisit it,
  in a line that begins with `**Revisit when:**` and goes on to say it. The
  entries are the file's sections: the headings one level below its title
  (`##`); a deeper heading is part of the entry above it. No two entries
  share a revisit line.

Each check is run on a known snippet as well, so that a parser that no
longer understands the files fails instead of passing with nothing checked.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CARGO_TOML = REPO_ROOT / "Cargo.toml"
README = REPO_ROOT / "README.md"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
DECISIONS = REPO_ROOT / "docs" / "decisions.md"

# "Rust (1.88 or newer", "A Rust toolchain (1.88 or newer, …": at most three
# words between "Rust" and the parenthesis, so that another tool's version
# further on ("Go (1.24 or newer)") is not taken for Rust's.
RUST_VERSION = re.compile(r"\bRust\b(?:\s+[\w-]+){0,3}\s*\(\s*(\d+\.\d+(?:\.\d+)?)\s+or\s+newer\b")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
REVISIT = "**Revisit when:**"
# What a revisit line must at least say after its marker.
MIN_REVISIT_WORDS = 5


def version_key(version: str) -> tuple[int, ...]:
    """Comparable versions: "1.88" and "1.88.0" are the same minimum."""
    parts = [int(p) for p in version.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def rust_versions_in(text: str) -> list[str]:
    """Every minimum Rust version `text` states, in order."""
    return RUST_VERSION.findall(" ".join(text.split()))


def cargo_rust_version(cargo_toml: dict) -> str:
    return cargo_toml["workspace"]["package"]["rust-version"]


def workspace_crates(cargo_toml: dict, root: Path) -> list[tuple[str, str]]:
    """(directory, package name) of every member of the workspace."""
    crates = []
    for member in cargo_toml["workspace"]["members"]:
        manifest = root / member / "Cargo.toml"
        assert manifest.is_file(), f"Cargo.toml lists the member {member!r}, which has no {manifest}"
        crates.append((member, tomllib.loads(manifest.read_text())["package"]["name"]))
    return crates


def unnamed_crates(doc: str, crates: list[tuple[str, str]]) -> list[str]:
    """Directories of the crates that `doc` names neither by directory nor by
    package name in inline code."""
    prose = FENCE.sub("", doc)
    code = {span.strip() for span in INLINE.findall(prose)}
    return [d for d, package in crates if not {d, d.rstrip("/") + "/", package} & code]


def decision_entries(text: str) -> list[tuple[str, str]]:
    """(title, body) of every entry: the sections at the first heading level
    below the title's, each with any deeper sections inside it. Headings in
    code blocks are not headings."""
    text = FENCE.sub("", text)
    headings = [(len(m.group(1)), m.group(2), m) for m in HEADING.finditer(text)]
    title_level = min((level for level, _, _ in headings), default=1)
    below = [level for level, _, _ in headings if level > title_level]
    if not below:
        return []
    entry_level = min(below)
    entries = []
    for level, title, m in headings:
        if level != entry_level:
            continue
        # An entry ends where the next one (or a heading above its level) begins.
        ends = [other.start() for lvl, _, other in headings if other.start() > m.start() and lvl <= entry_level]
        entries.append((title, text[m.end():min(ends, default=len(text))]))
    return entries


def revisit_line(body: str) -> str | None:
    """What the entry's revisit line says (with the rest of its paragraph,
    since the line may be wrapped), or None if it has none that says
    something."""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(REVISIT):
            continue
        paragraph = [line[len(REVISIT):]]
        for more in lines[i + 1:]:
            if not more.strip() or HEADING.match(more):
                break
            paragraph.append(more)
        said = " ".join(" ".join(paragraph).split())
        if len(re.findall(r"\w+", said)) >= MIN_REVISIT_WORDS:
            return said
    return None


def entries_without_revisit(text: str) -> list[str]:
    return [title for title, body in decision_entries(text) if revisit_line(body) is None]


def shared_revisit_lines(text: str) -> dict[str, list[str]]:
    by_line: dict[str, list[str]] = {}
    for title, body in decision_entries(text):
        said = revisit_line(body)
        if said is not None:
            by_line.setdefault(said, []).append(title)
    return {said: titles for said, titles in by_line.items() if len(titles) > 1}


CARGO = tomllib.loads(CARGO_TOML.read_text())


def test_the_checks_catch_what_they_are_for():
    # The README's Rust version: found where it is said, not another tool's.
    assert rust_versions_in("A Rust toolchain (1.87 or newer, with rustfmt and\nclippy), and Go (1.24 or newer)") \
        == ["1.87"]
    assert rust_versions_in("A Rust\ntoolchain (1.88 or\nnewer)") == ["1.88"]
    assert rust_versions_in("Go (1.24 or newer) and rustup") == []
    assert version_key("1.88") == version_key("1.88.0") != version_key("1.87")

    # Crates: named by directory or package name in inline code, not in prose
    # or in a code block.
    crates = [("formats", "strata-formats"), ("tools/faultfs", "strata-faultfs"),
              ("control_plane", "strata-control-plane"), ("cli", "strata")]
    doc = ("- `formats/` (PostgreSQL's formats)\n- the fault injector `strata-faultfs`\n"
           "- the control plane, a control_plane crate\n```\ncli/\n```\n")
    assert unnamed_crates(doc, crates) == ["control_plane", "cli"]
    assert unnamed_crates(doc + "`control_plane/` and `cli`", crates) == []

    # Decisions: entries are the `##` sections (a `###` is part of its entry,
    # a heading in a code block is none); a marker with nothing after it,
    # or too little, is no revisit line.
    decisions = """# Decisions

Each entry: ... **Revisit when:** appears here too, outside any entry.

## A. Has one
Text.
### A detail
**Revisit when:** the write rate passes 10 MB/s
on one timeline.

## B. Lacks one
Text that says revisit when something happens, but not as the line.
```
## Not a heading
**Revisit when:** this line is in a code block, not in entry B.
```

## C. Says nothing
**Revisit when:** …

## D. Copies A
**Revisit when:** the write rate passes 10 MB/s on one timeline.
"""
    assert [title for title, _ in decision_entries(decisions)] == ["A. Has one", "B. Lacks one", "C. Says nothing",
                                                                    "D. Copies A"]
    assert revisit_line(decision_entries(decisions)[0][1]) == "the write rate passes 10 MB/s on one timeline."
    assert entries_without_revisit(decisions) == ["B. Lacks one", "C. Says nothing"]
    assert shared_revisit_lines(decisions) == {
        "the write rate passes 10 MB/s on one timeline.": ["A. Has one", "D. Copies A"]}


def test_the_readme_states_cargos_minimum_rust_version():
    wanted = cargo_rust_version(CARGO)
    stated = rust_versions_in(README.read_text())
    assert stated, "README.md does not say which Rust version it needs (\"a Rust toolchain (X.Y or newer\")"
    wrong = [v for v in stated if version_key(v) != version_key(wanted)]
    assert not wrong, f"README.md asks for Rust {', '.join(wrong)} or newer; Cargo.toml's rust-version is {wanted}"


def test_the_architecture_names_every_workspace_crate():
    crates = workspace_crates(CARGO, REPO_ROOT)
    assert len(crates) >= 10, f"only {len(crates)} workspace members read from {CARGO_TOML}: {crates}"
    missing = unnamed_crates(ARCHITECTURE.read_text(), crates)
    assert not missing, (f"docs/architecture.md does not name these workspace crates (by directory or package "
                         f"name, in inline code): {missing}")


def test_every_decision_says_when_to_revisit_it():
    text = DECISIONS.read_text()
    entries = decision_entries(text)
    assert len(entries) >= 20, f"only {len(entries)} entries found in docs/decisions.md"
    missing = entries_without_revisit(text)
    assert not missing, (f"entries of docs/decisions.md without a line \"{REVISIT} …\" that says what would make "
                         f"us revisit them: {missing}")
    shared = shared_revisit_lines(text)
    assert not shared, f"entries of docs/decisions.md that share one revisit line: {shared}"
