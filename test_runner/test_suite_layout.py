"""The layout of the test suite itself, checked without a cluster: what test
files share lives in `fixtures/` and nowhere else. No test file imports
another test file (or conftest.py), and no fixtures module imports a test
file; every Python file of the suite begins with a docstring saying what
it is."""

from __future__ import annotations

import ast
from pathlib import Path

TEST_RUNNER = Path(__file__).resolve().parent
FIXTURES = TEST_RUNNER / "fixtures"


def is_suite_module(name: str) -> bool:
    """Whether a module name is a test file or conftest.py of the suite."""
    top = name.split(".")[0]
    return top.startswith("test_") or top == "conftest"


def suite_imports(source: str, filename: str = "<source>") -> list[str]:
    """The test modules (and conftest) that `source` imports anywhere, also
    inside functions, as `line: module`: `import test_x`, `from test_x
    import y`, `importlib.import_module("test_x")` and `__import__("test_x")`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from . import test_x` names the module among what it imports.
            names = [node.module] if node.module else [alias.name for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (isinstance(node.func, ast.Name) and node.func.id == "__import__"
                   or isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if is_suite_module(name)]
    return found


def test_the_checker_finds_every_kind_of_import():
    source = ("import os\nimport test_a\nfrom test_b import x\nfrom fixtures.test_like import y\n"
              "def f():\n    from test_c import z\n    import conftest\n"
              "importlib.import_module('test_d')\n__import__('test_e.sub')\nfrom fixtures import cluster\n")
    assert suite_imports(source) == ["2: test_a", "3: test_b", "6: test_c", "7: conftest", "8: test_d",
                                     "9: test_e.sub"]
    assert suite_imports("from . import test_f\nfrom .test_g import h\n") == ["1: test_f", "2: test_g"]


def offenders(files: list[Path]) -> dict[str, list[str]]:
    return {p.name: found for p in files if (found := suite_imports(p.read_text(), str(p)))}


def test_no_test_file_imports_another():
    files = sorted(TEST_RUNNER.glob("test_*.py"))
    assert len(files) > 20, f"only {len(files)} test files found in {TEST_RUNNER}"
    found = offenders(files)
    assert not found, f"test files import other test files (move what they share to fixtures/): {found}"


def test_no_fixtures_module_imports_a_test_file():
    files = sorted(FIXTURES.glob("*.py"))
    assert len(files) > 10, f"only {len(files)} fixtures modules found in {FIXTURES}"
    found = offenders(files)
    assert not found, f"fixtures modules import test files: {found}"


def test_every_file_says_what_it_is():
    files = sorted(TEST_RUNNER.glob("*.py")) + sorted(FIXTURES.glob("*.py"))
    missing = [str(p.relative_to(TEST_RUNNER)) for p in files if ast.get_docstring(ast.parse(p.read_text())) is None]
    assert not missing, f"files without a docstring: {missing}"


class _Item:
    def __init__(self, nodeid: str):
        self.nodeid = nodeid


def test_the_longest_known_tests_run_first_and_the_record_ages_out(tmp_path):
    """fixtures/order.py: known tests longest first, unknown ones at the
    guess in their collection order; the record keeps this run's times,
    ages the others and drops them after KEEP_RUNS runs; a broken file
    is no record."""
    from fixtures import order

    known = {"a": {"seconds": 1.0, "age": 0}, "b": {"seconds": 300.0, "age": 3},
             "gone": {"seconds": 50.0, "age": order.KEEP_RUNS - 1}}
    items = [_Item(n) for n in ("a", "new1", "b", "new2")]
    assert [i.nodeid for i in order.longest_first(items, known)] == ["b", "new1", "new2", "a"]
    # Dealt to three workers, each contiguous third starts with its longest.
    assert order.dealt(list(range(7)), 3) == [0, 3, 6, 1, 4, 2, 5]
    assert order.dealt([1, 2], 1) == [1, 2]

    merged = order.merge(known, {"a": 2.5, "new1": 9.0})
    assert merged == {"a": {"seconds": 2.5, "age": 0}, "new1": {"seconds": 9.0, "age": 0},
                      "b": {"seconds": 300.0, "age": 4}}
    path = tmp_path / "cache" / "durations.json"
    order.save(path, merged)
    assert order.load(path) == merged
    path.write_text("{not json")
    assert order.load(path) == {}
    path.write_text('{"tests": {"x": {"seconds": "slow"}, "y": {"seconds": 2}}}')
    assert order.load(path) == {"y": {"seconds": 2}}
    assert order.load(None) == {}
