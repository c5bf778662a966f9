"""The layout of bench/, checked without running a benchmark:

- a benchmark is a module of bench/ that runs as a program (it has an
  `if __name__ == "__main__":` block); every other module is a library.
  bench/README.md's command list (`.venv/bin/python -m bench.NAME  #
  what it measures`) names every benchmark, each with what it measures,
  and nothing else: no library, no module that is not there;
- what the benchmarks share is in the library `bench.harness`, which each
  benchmark imports; no benchmark imports another one (what two of them
  share belongs in the harness);
- nothing under bench/ changes Python's import path: the benchmarks run as
  modules from the repository root, which is on the path then, and import
  the test suite's helpers as `test_runner.fixtures`;
- each benchmark's docstring shows how to run it, and `python -m
  bench.NAME --help` answers: the module and everything it imports load,
  and it reads its options before it starts anything.

The checkers are shown to find what they look for on small sources, and
the `--help` check to fail on a module that is not there, so that a clean
result means something.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
README = BENCH / "README.md"
HARNESS = "harness"
# A line of the README's command list: the module, then what it measures.
LISTED = re.compile(r"^\.venv/bin/python -m bench\.(\w+) +# *(.*)$", re.M)
# Any module of bench/ the README runs, in the list or in a section's usage.
RUN = re.compile(r"-m bench\.(\w+)")
# A module that is not there, whose `--help` must fail: the check can fail.
MISSING = "no_such_benchmark"
# Runs `python -m MODULE --help` for each module named in its arguments, one
# after the other in this one interpreter (as `-m` does, through runpy, so
# that the modules they share load once), and prints how each ended as JSON.
HELP_DRIVER = """
import contextlib, io, json, runpy, sys, traceback
ended = {}
for module in sys.argv[1:]:
    out, err, code = io.StringIO(), io.StringIO(), "returned without exiting"
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code or 0
    except BaseException:
        code = "raised"
        err.write(traceback.format_exc())
    ended[module] = {"exit": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
print(json.dumps(ended))
"""


def is_benchmark(source: str) -> bool:
    """Whether a module runs as a program: an `if __name__ == "__main__":`
    block at its top level."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
                    isinstance(n, ast.Constant) and n.value == "__main__" for n in names):
                return True
    return False


def modules() -> dict[str, str]:
    """The source of every module of bench/ but the package's own, by name."""
    return {p.stem: p.read_text() for p in sorted(BENCH.glob("*.py")) if p.name != "__init__.py"}


def benchmarks() -> list[str]:
    return [name for name, source in modules().items() if is_benchmark(source)]


def libraries() -> list[str]:
    return [name for name, source in modules().items() if not is_benchmark(source)]


def listed(readme: str) -> dict[str, str]:
    """The README's command list: what each module it runs measures."""
    return {m.group(1): m.group(2).strip() for m in LISTED.finditer(readme)}


def path_edits(source: str) -> list[str]:
    """Where `source` touches the import path, as `line: what`: any use of
    `sys.path` (also through `import sys as s`), `from sys import path`,
    and `site.addsitedir`."""
    tree = ast.parse(source)
    sys_names = {"sys"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                           for a in n.names if a.name == "sys" and a.asname}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id in sys_names):
            found.append((node.lineno, f"{node.value.id}.path"))
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            found.append((node.lineno, "from sys import path"))
        elif isinstance(node, ast.Attribute) and node.attr == "addsitedir":
            found.append((node.lineno, "addsitedir"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def imported_modules(source: str) -> set[str]:
    """The bench modules `source` imports, by name: `from bench.harness
    import x`, `from bench import harness`, `import bench.harness`, and the
    relative forms `from .harness import x`, `from . import harness`."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
        elif isinstance(node, ast.ImportFrom):
            absolute = node.level == 0 and node.module is not None
            if absolute and node.module.startswith("bench."):
                found.add(node.module.split(".")[1])
            elif node.level == 1 and node.module is not None:
                found.add(node.module.split(".")[0])
            elif (absolute and node.module == "bench") or (node.level == 1 and node.module is None):
                found |= {a.name for a in node.names}
    return found


def run_help(names: tuple[str, ...]) -> dict[str, dict]:
    """How `python -m bench.NAME --help` ended for each of `names` (exit
    code, output), run from the repository root as the README runs a
    benchmark, in one interpreter (HELP_DRIVER), leaving no bytecode behind."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    res = subprocess.run([sys.executable, "-c", HELP_DRIVER, *(f"bench.{n}" for n in names)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, f"the --help driver failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    return {module.removeprefix("bench."): how for module, how in json.loads(res.stdout.splitlines()[-1]).items()}


@lru_cache(maxsize=None)
def help_results() -> dict[str, dict]:
    """`--help` of every benchmark and of MISSING, run once for all the tests."""
    return run_help((*benchmarks(), MISSING))


# ---------------------------------------------------------------- checkers

def test_the_checkers_find_what_they_look_for():
    assert is_benchmark("def main():\n    pass\n\nif __name__ == '__main__':\n    main()\n")
    assert is_benchmark('if "__main__" == __name__:\n    pass\n')
    assert not is_benchmark("def main():\n    if __name__ == '__main__':\n        pass\n")
    assert not is_benchmark('"""A library."""\nNAME = "__main__"\n')

    assert listed(".venv/bin/python -m bench.a   # what a measures\n"
                  ".venv/bin/python -m bench.b [--quick]\n"
                  "python -m bench.c  # not the command list\n") == {"a": "what a measures"}

    source = ("import os\nimport sys\nimport sys as system\nfrom sys import path\n"
              "sys.path.insert(0, 'x')\nsystem.path.append('y')\nsite.addsitedir('z')\nos.path.join('a')\n")
    assert path_edits(source) == ["4: from sys import path", "5: sys.path", "6: system.path", "7: addsitedir"]
    assert path_edits("import os\nos.path.exists('x')\nsys_path = 1\n") == []

    assert imported_modules("from bench.harness import x\nfrom bench import report, y\nimport bench.getpage\n"
                            "from .sites import z\nfrom . import branch\nfrom test_runner.fixtures import pg\n"
                            "import harness\n") == {"harness", "report", "y", "getpage", "sites", "branch"}
    assert HARNESS not in imported_modules("import harness\nfrom fixtures.harness import x\n")


def test_the_help_check_fails_on_a_module_that_is_not_there():
    how = help_results()[MISSING]
    assert how["exit"] != 0 and "No module named" in how["stderr"], how


# ------------------------------------------------------------------ layout

def test_every_benchmark_is_listed_and_every_listed_one_exists():
    found, names = listed(README.read_text()), benchmarks()
    assert len(names) > 15, f"only {len(names)} benchmarks found in {BENCH}"
    assert len(found) > 15, f"the command list of {README} lists only {len(found)} modules: {found}"
    assert not set(names) - set(found), f"benchmarks missing from the command list: {set(names) - set(found)}"
    assert not set(found) - set(names), f"listed but not a benchmark of bench/: {set(found) - set(names)}"
    assert all(found.values()), f"listed without what they measure: {[n for n, d in found.items() if not d]}"


def test_every_module_the_readme_runs_is_a_benchmark():
    run = set(RUN.findall(README.read_text()))
    assert not run - set(benchmarks()), f"the README runs what is not a benchmark: {run - set(benchmarks())}"


def test_the_harness_is_a_library():
    assert HARNESS in libraries(), f"bench/{HARNESS}.py is missing or runs as a program"


def test_nothing_under_bench_changes_the_import_path():
    files = sorted(BENCH.rglob("*.py"))
    assert len(files) > 15, f"only {len(files)} Python files found under {BENCH}"
    found = {str(p.relative_to(REPO)): edits for p in files if (edits := path_edits(p.read_text()))}
    assert not found, f"files that change the import path (run the benchmarks as modules instead): {found}"


def test_every_benchmark_imports_the_harness_and_no_other_benchmark():
    sources, names = modules(), benchmarks()
    missing = [n for n in names if HARNESS not in imported_modules(sources[n])]
    assert not missing, f"benchmarks that do not import bench.{HARNESS}: {missing}"
    shared = {n: sorted(imported_modules(sources[n]) & set(names)) for n in names}
    shared = {n: others for n, others in shared.items() if others}
    assert not shared, f"benchmarks importing other benchmarks (move what they share to the harness): {shared}"


@pytest.mark.parametrize("name", benchmarks())
def test_benchmark_says_how_to_run_it(name):
    doc = ast.get_docstring(ast.parse(modules()[name])) or ""
    assert f"Usage: .venv/bin/python -m bench.{name}" in doc, f"bench/{name}.py: no usage line running it as a module"


@pytest.mark.parametrize("name", benchmarks())
def test_benchmark_answers_help(name):
    how = help_results()[name]
    assert how["exit"] == 0 and how["stdout"].startswith("usage:"), (
        f"python -m bench.{name} --help: exit {how['exit']}\n{how['stdout'][-2000:]}\n{how['stderr'][-2000:]}")
