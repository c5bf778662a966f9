"""The control plane reads as steps: no function of `control_plane/` is
longer than 100 lines (`tools/function_length.py`). The checker is shown to
measure what it claims on small sources written here, so a clean result
on the crate means something."""

from __future__ import annotations

import importlib.util
import re
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


# `println!`, `print!`, `eprintln!` or `eprint!` called (comments and
# strings are blanked first: naming one in a doc comment is no call).
PRINT_CALL = re.compile(r"(?<![A-Za-z0-9_])(e?print(?:ln)?)\s*!\s*[(\[{]")


def print_calls(tool, text: str) -> list[tuple[int, str]]:
    """(line, macro) of every printing macro called in a Rust source."""
    code = tool.blank(text)
    return [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in PRINT_CALL.finditer(code)]


def test_the_control_plane_prints_nothing():
    """The control plane's operations say what they did through their
    results and progress events (`report::Event`); only the CLI prints,
    through its own helper that survives a closed stdout, and `strata node`
    answers with the same lines. The checker is shown to find each macro
    and to skip comments and strings."""
    tool = load_tool()
    sample = (
        "fn f() {\n"
        "    println!(\"a\");\n"
        "    print!(\"b\");\n"
        "    eprintln! (\"c\");\n"
        "    eprint!{\"d\"};\n"
        "    // println!(\"in a comment\");\n"
        "    let s = \"println!(in a string)\";\n"
        "    let x = my_println!(1); sprint!(2);\n"
        "}\n")
    assert print_calls(tool, sample) == [(2, "println"), (3, "print"), (4, "eprintln"), (5, "eprint")]
    crate = REPO / "control_plane" / "src"
    files = sorted(crate.rglob("*.rs"))
    assert len(files) > 10, f"the control plane's sources are not at {crate}"
    found = [f"{f.relative_to(REPO)}:{line} {name}!" for f in files for line, name in print_calls(tool, f.read_text())]
    assert not found, "the control plane prints; report an event or return an outcome instead:\n" + "\n".join(found)


# Crates without a limits module, and why.
NO_LIMITS = {
    "redo": "no queue, buffer, cache, timeout or retry: its size checks are PostgreSQL's page layout",
    "test_support": "test helpers only",
}
CONST_CHECK = "const _: () = assert!("


def workspace_crates() -> list[str]:
    import tomllib
    return tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["members"]


def test_every_crates_limits_live_in_one_module_with_compile_time_checks():
    """Each crate's bounds (queues, buffers, caches, timeouts, retries) are
    in its `src/limits.rs`, declared by the crate and with `const`
    assertions of how they relate; the crates without one say why
    (NO_LIMITS). Clippy's clock lint is on where time drives decisions."""
    crates = workspace_crates()
    assert len(crates) >= 14, crates
    missing, unchecked, undeclared = [], [], []
    for crate in crates:
        name = Path(crate).name
        limits = REPO / crate / "src" / "limits.rs"
        if name in NO_LIMITS:
            assert not limits.exists(), f"{crate} has a limits module: take it out of NO_LIMITS"
            continue
        if not limits.exists():
            missing.append(crate)
            continue
        if CONST_CHECK not in limits.read_text():
            unchecked.append(crate)
        roots = [REPO / crate / "src" / f for f in ("lib.rs", "main.rs") if (REPO / crate / "src" / f).exists()]
        if not any("mod limits;" in r.read_text() for r in roots):
            undeclared.append(crate)
    assert not missing, f"crates without src/limits.rs: {missing}"
    assert not unchecked, f"limits modules without a compile-time check: {unchecked}"
    assert not undeclared, f"limits modules not declared by their crate: {undeclared}"


def test_the_crates_that_decide_by_time_read_it_from_a_clock():
    """`Instant::now` and `SystemTime::now` are disallowed (clippy.toml)
    in the crates whose decisions depend on time: the controller, the
    pageserver, the safekeeper and the compute (docs/testing.md)."""
    for crate in ("controller", "pageserver", "safekeeper", "compute"):
        conf = (REPO / crate / "clippy.toml").read_text()
        for method in ("std::time::Instant::now", "std::time::SystemTime::now"):
            assert f'path = "{method}"' in conf, f"{crate}/clippy.toml does not disallow {method}"


def test_no_rust_test_fixes_the_clones_path_when_compiled():
    """A build cache serves clones at other paths, and cargo does not rebuild
    a test only because the clone moved: a path taken with `env!` at compile
    time may name a clone that is gone. Tests read cargo's variables when
    they run (`strata_test_support::paths`); this scan keeps it so."""
    pattern = re.compile(r'env!\(\s*"CARGO_(MANIFEST_DIR|MANIFEST_PATH|BIN_EXE_|TARGET_TMPDIR)')
    allowed = {REPO / "test_support" / "src" / "paths.rs"}
    offenders = []
    sources = subprocess.run(
        ["git", "ls-files", "*.rs"], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.split()
    assert len(sources) > 100, "the scan found the workspace's Rust sources"
    for name in sources:
        path = REPO / name
        if path in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "paths fixed at compile time:\n" + "\n".join(offenders)
    # The scan would see one.
    assert pattern.search('let p = env!("CARGO_BIN_EXE_strata-faultfs");')
