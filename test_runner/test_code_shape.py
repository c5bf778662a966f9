"""The control plane reads as steps: no function of `control_plane/` is
longer than 100 lines (`tools/function_length.py`). The checker is shown to
measure what it claims on small sources written here, so a clean result
on the crate means something."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "function_length.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("function_length", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_checker_measures_bodies_and_ignores_braces_in_strings_and_comments():
    tool = load_tool()
    source = (
        "/// f's doc\n"
        "pub fn f(x: u8) -> u8 {\n"          # line 2
        "    let s = \"}}} // {\";\n"
        "    // } a brace in a comment\n"
        "    let c = '}';\n"
        "    if x > 0 { x } else { 0 }\n"
        "}\n"                                 # line 7: 6 lines
        "trait T { fn g(&self); }\n"
        "fn h<'a>(s: &'a str) -> &'a str {\n"
        "    s\n"
        "}\n")
    assert tool.functions(source) == [("f", 2, 6), ("h", 9, 3)]
    long_one = "fn long() {\n" + "    step();\n" * 100 + "}\n"
    assert tool.functions(long_one) == [("long", 1, 102)]


def test_no_control_plane_function_is_over_100_lines(tmp_path):
    crate = REPO / "control_plane" / "src"
    assert len(list(crate.rglob("*.rs"))) > 10, f"the control plane's sources are not at {crate}"
    out = subprocess.run([sys.executable, str(TOOL), "--max", "100", str(crate)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"functions over 100 lines:\n{out.stdout}{out.stderr}"
    # The same run fails on a crate that has one.
    (tmp_path / "long.rs").write_text("fn long() {\n" + "    step();\n" * 100 + "}\n")
    out = subprocess.run([sys.executable, str(TOOL), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "long" in out.stdout
