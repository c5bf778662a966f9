"""The README says only what a machine can confirm, where a machine can:

- every `strata` command it shows exists. Commands are taken from the
  command list (the plain code block), from shell blocks and from inline
  code, wherever the binary is written as `strata`, a path ending in
  `/strata` (`target/release/strata`) or a shell variable (`"$strata"`).
  Of each, the subcommand words count: they end at the first word that is
  an option, a placeholder or a value; `start|stop` stands for both, and in
  the command list and inline code ` | ` separates alternatives that
  replace the last word (`strata init | start`, `… start NAME | list`).
  Each word must be one of the subcommands that `--help` lists at its
  level, and `strata <words> --help` must answer (exit 0, a usage line).
- every repository path it names (in inline code and code blocks, such as
  `docs/architecture.md`, `formats/`, `bench/wal_decode.py`) exists.
  Paths under a top-level directory that `.gitignore` names (`target/`,
  `.venv/`, `.strata/`) are made by the build or at run time, not part of
  the repository, and are not checked. A Python module run with `-m`
  from the repository root (`python -m bench.sites`) names its file
  (`bench/sites.py`).

The parser is checked as well, on a known snippet and by a floor on what
it finds in the README, so that a README it no longer understands fails
instead of passing with nothing checked.
"""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INLINE = re.compile(r"`([^`]+)`")
SHELL_LANGUAGES = {"sh", "bash", "shell", "console"}
LISTING_LANGUAGES = {"", "text"}
# A subcommand word: what clap derives from a Rust variant name.
WORD = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
SHELL_SEPARATORS = {"|", "||", "&&", ";", "&"}
# A relative path: a first component with a lower-case letter (not an LSN
# such as 0/16B3748, not a placeholder such as SPC/DB/REL), at least one "/".
PATH = re.compile(r"(?=[^/]*[a-z])[A-Za-z0-9_.][\w.+-]*(?:/[\w.+-]+)*/?")


def _is_binary(token: str) -> bool:
    t = token.strip("\"'")
    return t in {"strata", "$strata", "${strata}", "$STRATA_BIN", "${STRATA_BIN}"} or (
        t.endswith("/strata") and not t.startswith(("http:", "https:")))


def _split_top_level(text: str, sep: str = " | ") -> list[str]:
    """`text` cut at `sep` outside square brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        c = text[i]
        if c == "[":
            depth += 1
        elif c == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i + len(sep)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _words(tokens: list[str]) -> tuple[list[str], list[list[str]]]:
    """The subcommand words at the start of `tokens`: (the words before the
    last position, the alternatives for the last position)."""
    path: list[str] = []
    for tok in tokens:
        if WORD.fullmatch(tok):
            path.append(tok)
            continue
        alternatives = tok.split("|")
        if len(alternatives) > 1 and all(WORD.fullmatch(a) for a in alternatives):
            return path, [[a] for a in alternatives]
        break
    if not path:
        return [], [[]]
    return path[:-1], [path[-1:]]


def commands_in(args: str, alternatives: bool) -> list[tuple[str, ...]]:
    """Subcommand word lists of one invocation, given the text after the binary."""
    parts = _split_top_level(args) if alternatives else [args]
    prefix, lasts = _words(parts[0].split())
    found = [tuple(prefix + last) for last in lasts]
    for part in parts[1:]:
        more_prefix, more_lasts = _words(part.split())
        for last in more_lasts:
            words = more_prefix + last
            if words:
                found.append(tuple(prefix + words))
    return [c for c in found if c]


def _invocations(line: str, shell: bool) -> list[tuple[str, ...]]:
    """Commands of every invocation of the binary in one line of text."""
    if shell:
        line = re.sub(r"(^|\s)#.*", "", line)
    tokens = line.split()
    found = []
    for i, tok in enumerate(tokens):
        if not _is_binary(tok):
            continue
        rest = tokens[i + 1:]
        if shell:
            for j, t in enumerate(rest):
                if t in SHELL_SEPARATORS:
                    rest = rest[:j]
                    break
        found.extend(commands_in(" ".join(rest), alternatives=not shell))
    return found


def _ignored_roots(repo: Path) -> set[str]:
    """Top-level directories `.gitignore` names: made by the build or at run time."""
    roots = set()
    gitignore = repo / ".gitignore"
    if gitignore.exists():
        for line in gitignore.read_text().splitlines():
            line = line.strip()
            m = re.fullmatch(r"/([^/*?\[!#]+)/?", line)
            if m:
                roots.add(m.group(1))
    return roots


# `python -m bench.sites`: a module run from the repository root is its file.
PYTHON_MODULE = re.compile(r"(?:^|\s)-m\s+([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)")


def _paths_in(text: str, with_extension_only: bool) -> list[str]:
    found = []
    for tok in text.split():
        tok = tok.strip("()[],;:\"'")
        if tok.startswith("./"):
            tok = tok[2:]
        if "/" not in tok or tok.startswith(("/", "~", "$", "-")) or ":" in tok or "://" in tok:
            continue
        if not PATH.fullmatch(tok):
            continue
        if with_extension_only and not re.search(r"\.[a-z]{1,5}$", tok):
            continue
        found.append(tok)
    return found + [m.group(1).replace(".", "/") + ".py" for m in PYTHON_MODULE.finditer(text)]


def parse_readme(text: str, ignored_roots: set[str] = frozenset()) -> tuple[list[tuple[str, ...]], list[str]]:
    """(every command, every repository path) the README shows, in order, once each."""
    commands: list[tuple[str, ...]] = []
    paths: list[str] = []
    outside = []
    last = 0
    for m in FENCE.finditer(text):
        outside.append(text[last:m.start()])
        last = m.end()
        language, body = m.group(1).strip().lower(), m.group(2)
        if language in SHELL_LANGUAGES:
            for line in body.splitlines():
                commands += _invocations(line, shell=True)
                paths += _paths_in(re.sub(r"(^|\s)#.*", "", line), with_extension_only=False)
        elif language in LISTING_LANGUAGES:
            for line in body.splitlines():
                # The command list: a line that starts with the binary is a
                # command; indented lines continue the description before.
                if line[:1].strip() and _is_binary(line.split()[0]):
                    commands += _invocations(line, shell=False)
                paths += _paths_in(line, with_extension_only=True)
    outside.append(text[last:])
    for chunk in outside:
        for m in INLINE.finditer(chunk):
            code = " ".join(m.group(1).split())
            commands += _invocations(code, shell=False)
            paths += _paths_in(code, with_extension_only=False)
    paths = [p for p in paths if p.split("/")[0] not in ignored_roots]
    return list(dict.fromkeys(commands)), list(dict.fromkeys(paths))


README_COMMANDS, README_PATHS = parse_readme(README.read_text(), _ignored_roots(REPO_ROOT))


def test_the_parser_reads_commands_and_paths_as_meant():
    snippet = """
Run `target/release/strata stop --workdir .strata`; see `docs/local-cluster.md`
and `fuzz/run.sh SECONDS`. The data lives in `~/.cache/strata/` and `.strata/`.

```
strata wal dump [--json] [--start LSN] FILE_OR_DIR...   decode (docs/wal-dump.md)
strata init | start | stop | status [--json]             the local cluster
strata endpoint start|stop NAME [--at LSN|TIME] | list
                                                         strata in a description
strata branch create NAME [--at LSN | --at-time TIME] | list [--json] | delete NAME
strata pagebench --pageserver H:P --rel SPC/DB/REL
```

```sh
"$strata" compute sync-safekeepers --tenant-id T | tail -1   # strata wal bogus
./scripts/setup.sh && .venv/bin/python -m bench.wal_decode
```
"""
    commands, paths = parse_readme(snippet, {".strata", ".venv", "target"})
    assert commands == [
        ("wal", "dump"),
        ("init",), ("start",), ("stop",), ("status",),
        ("endpoint", "start"), ("endpoint", "stop"), ("endpoint", "list"),
        ("branch", "create"), ("branch", "list"), ("branch", "delete"),
        ("pagebench",),
        ("compute", "sync-safekeepers"),
    ], commands  # the inline `strata stop` is a repeat
    assert paths == ["docs/wal-dump.md", "scripts/setup.sh", "bench/wal_decode.py",
                     "docs/local-cluster.md", "fuzz/run.sh"], paths


def test_the_readme_is_understood():
    """An empty parse must not pass: the README shows many commands and paths."""
    assert len(README_COMMANDS) >= 15, README_COMMANDS
    for expected in [("wal", "dump"), ("endpoint", "start"), ("endpoint", "list"), ("init",), ("stop",),
                     ("branch", "create"), ("safekeeper", "replace"), ("compute", "sync-safekeepers")]:
        assert expected in README_COMMANDS, (expected, README_COMMANDS)
    assert len(README_PATHS) >= 15, README_PATHS
    for expected in ["docs/architecture.md", "scripts/setup.sh", "bench/wal_decode.py", "formats/", "test_runner/"]:
        assert expected in README_PATHS, (expected, README_PATHS)


@pytest.mark.parametrize("path", README_PATHS)
def test_every_path_the_readme_names_exists(path):
    assert (REPO_ROOT / path).exists(), f"README.md names {path}, which is not in the repository"


@lru_cache(maxsize=None)
def _help(strata_bin: Path, words: tuple[str, ...]) -> tuple[int, str, list[str]]:
    """Exit code, output and listed subcommands of `strata <words> --help`."""
    out = subprocess.run([str(strata_bin), *words, "--help"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    subcommands, in_list = [], False
    for line in out.stdout.splitlines():
        if line.strip() == "Commands:":
            in_list = True
        elif in_list and not line.strip():
            in_list = False
        elif in_list:
            m = re.match(r"  ([a-z][a-z0-9-]*)(\s|$)", line)
            if m:
                subcommands.append(m.group(1))
    return out.returncode, out.stdout + out.stderr, subcommands


@pytest.mark.parametrize("words", README_COMMANDS, ids=" ".join)
def test_every_command_the_readme_shows_exists(strata_bin, words):
    for depth in range(len(words)):
        code, output, subcommands = _help(strata_bin, words[:depth])
        assert code == 0, f"strata {' '.join(words[:depth])} --help failed:\n{output}"
        if not subcommands:
            pytest.fail(f"README.md shows `strata {' '.join(words)}`, but `strata {' '.join(words[:depth])}` "
                        f"has no subcommands:\n{output}")
        assert words[depth] in subcommands, (
            f"README.md shows `strata {' '.join(words)}`, but `strata {' '.join(words[:depth])}` has no "
            f"subcommand {words[depth]!r} (it has: {', '.join(subcommands)})")
    code, output, _ = _help(strata_bin, words)
    assert code == 0 and "Usage: strata " + " ".join(words) in output, (
        f"strata {' '.join(words)} --help:\n{output}")
