"""No two modules of a Rust crate import each other, directly or through
others (`tools/module_graph.py`): each crate's modules form a tree that can
be read, tested and moved one module at a time.

The checker is shown to find circles in small crates written here (a
sibling pair, a parent and child through a re-export, a longer loop), so a
clean result on the workspace means something.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "module_graph.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("module_graph", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_crate(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_workspace_has_no_import_circles():
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"import circles:\n{out.stdout}{out.stderr}"
    crates = load_tool().workspace_crates()
    assert len(crates) >= 10, crates
    assert f"no import circles in {len(crates)} crates" in out.stdout


def test_finds_circles(tmp_path):
    tool = load_tool()
    siblings = write_crate(tmp_path / "siblings", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "use crate::b::B;\npub struct A;\n",
        "b.rs": "pub struct B;\nfn f() { let _ = crate::a::A; }\n",
    })
    reexport = write_crate(tmp_path / "reexport", {
        "lib.rs": "mod outer;\n",
        "outer/mod.rs": "mod inner;\npub use inner::Thing;\npub struct Shared;\nfn g() { inner::make(); }\n",
        "outer/inner.rs": "use super::Shared;\npub struct Thing;\npub fn make() {}\n",
    })
    loop3 = write_crate(tmp_path / "loop3", {
        "lib.rs": "pub mod x;\npub mod y;\npub mod z;\n",
        "x.rs": "use crate::y::{self, Y as Why};\npub struct X;\n",
        "y.rs": "pub struct Y;\nuse super::z::Z;\n",
        "z.rs": "pub struct Z(crate::x::X);\n",
    })
    tree = write_crate(tmp_path / "tree", {
        "lib.rs": "mod a;\nmod b;\nmod shared;\npub use a::A;\nfn main() { a::run(); }\n",
        "a.rs": "use crate::shared::S;\nuse crate::b;\npub struct A;\npub fn run() { b::go(); }\n",
        "b.rs": "use crate::shared::S;\n// crate::a::A in a comment is no use\nconst T: &str = \"crate::a::A\";\npub fn go() {}\n",
        "shared.rs": "pub struct S;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    })
    reports = tool.check([siblings])
    assert len(reports) == 1 and "crate::a, crate::b" in reports[0], reports
    reports = tool.check([reexport])
    assert len(reports) == 1 and "crate::outer, crate::outer::inner" in reports[0], reports
    reports = tool.check([loop3])
    assert len(reports) == 1 and "circle of 3 modules" in reports[0], reports
    assert tool.check([tree]) == []
