"""No two modules of a Rust crate import each other, directly or through
others (`tools/module_graph.py`): each crate's modules form a tree that can
be read, tested and moved one module at a time.

The checker is shown to find circles in small crates written here (a
sibling pair, a parent and child through a re-export, a longer loop, and
loops that close through re-exports: a private module behind its
directory's `mod.rs`, a glob of re-exports, a re-exported name its module
writes), so a clean result on the workspace means something.
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


def test_follows_reexports_to_where_items_live(tmp_path):
    """A loop that closes through a re-export is a loop. The shape the
    safekeeper had: a task module keeps its per-item state in a private
    `state.rs` that its `mod.rs` re-exports; the item holding that state is
    reached from the task through a registry and a hub. Nothing outside
    `task` can name `task::state`, so the item depends on `task`."""
    tool = load_tool()
    behind_mod_rs = write_crate(tmp_path / "behind_mod_rs", {
        "lib.rs": "mod hub;\nmod registry;\nmod item;\nmod task;\n",
        "hub.rs": "use crate::registry::Registry;\npub struct Hub { pub registry: Registry }\n",
        "registry.rs": "use crate::item::Item;\npub struct Registry(pub Vec<Item>);\n",
        "item.rs": "pub struct Item { pub work: crate::task::WorkState }\n",
        "task/mod.rs": "use crate::hub::Hub;\nmod state;\npub use state::WorkState;\n"
                       "pub fn run(hub: &Hub) { for item in &hub.registry.0 { let _ = &item.work; } }\n",
        "task/state.rs": "pub struct WorkState { pub(super) rounds: u64 }\n",
    })
    # Modules that name each other's items through a glob of re-exports.
    prelude = write_crate(tmp_path / "prelude", {
        "lib.rs": "mod a;\nmod b;\nmod prelude;\n",
        "prelude.rs": "pub use crate::a::A;\npub use crate::b::B;\n",
        "a.rs": "use crate::prelude::*;\npub struct A;\npub fn f(_: B) {}\n",
        "b.rs": "use crate::prelude::*;\npub struct B;\npub fn g(_: A) {}\n",
    })
    # A parent that re-exports a child's item and writes it itself.
    written = write_crate(tmp_path / "written", {
        "lib.rs": "pub mod msg;\n",
        "msg/mod.rs": "mod history;\npub use history::History;\npub type Term = u64;\n"
                      "pub struct Greeting { pub history: History }\n",
        "msg/history.rs": "use super::Term;\npub struct History(pub Vec<Term>);\n",
    })
    # Inside the directory, a sibling reaches the private module's item
    # through the parent's re-export: the edge goes to where it lives, and
    # the parent that uses both is no circle.
    inside = write_crate(tmp_path / "inside", {
        "lib.rs": "mod agent;\npub use agent::start;\n",
        "agent/mod.rs": "mod config;\nmod pgconf;\npub use config::AgentConfig;\n"
                        "pub fn start(c: &AgentConfig) { pgconf::write(c); }\n",
        "agent/config.rs": "pub struct AgentConfig;\n",
        "agent/pgconf.rs": "use super::AgentConfig;\npub fn write(_: &AgentConfig) {}\n",
    })
    reports = tool.check([behind_mod_rs])
    assert len(reports) == 1 and "crate::hub, crate::item, crate::registry, crate::task" in reports[0], reports
    assert "crate::item -> crate::task  (" in reports[0], reports
    reports = tool.check([prelude])
    assert len(reports) == 1 and "crate::a, crate::b" in reports[0], reports
    reports = tool.check([written])
    assert len(reports) == 1 and "crate::msg, crate::msg::history" in reports[0], reports
    assert tool.check([inside]) == []


def test_a_url_in_a_string_hides_no_use(tmp_path):
    """`//` inside a string literal is no comment: a URL does not blank the
    code that follows it, up to the next quote."""
    tool = load_tool()
    url = write_crate(tmp_path / "url", {
        "lib.rs": "mod a;\nmod b;\n",
        "a.rs": "pub const URL: &str = \"http://x\";\npub struct A;\n"
                "pub fn f() { crate::b::g(); let _ = \"y\"; }\n",
        "b.rs": "pub fn g() {}\nfn h(_: crate::a::A) {}\n",
    })
    reports = tool.check([url])
    assert len(reports) == 1 and "crate::a, crate::b" in reports[0], reports
