"""The security matrix (`docs/security.md`, "Every HTTP route") is the
routers' own: every route of every HTTP router in the code, read from its
source as `test_openapi.py` reads them, is in a group the token guard
covers (`guard(GROUP, auth, Need::X)`), and the document lists exactly
those routes, each with the scope its group needs. A route added without
a guard, or without its line in the matrix, fails here; so does a line
for a route that is gone."""

from __future__ import annotations

import re
from pathlib import Path

from fixtures.routers import closing_paren, routes_in

REPO_ROOT = Path(__file__).resolve().parent.parent

# Every HTTP router of the project, by the name the matrix gives it.
ROUTERS = {
    "pageserver": REPO_ROOT / "pageserver" / "src" / "http.rs",
    "safekeeper": REPO_ROOT / "safekeeper" / "src" / "http.rs",
    "controller": REPO_ROOT / "controller" / "src" / "http.rs",
    "agent": REPO_ROOT / "compute" / "src" / "agent" / "status.rs",
    "proposer": REPO_ROOT / "cli" / "src" / "compute.rs",
    "node": REPO_ROOT / "control_plane" / "src" / "node.rs",
    "link-proxy": REPO_ROOT / "link_proxy" / "src" / "http.rs",
    "proxy": REPO_ROOT / "proxy" / "src" / "http.rs",
    "console": REPO_ROOT / "console" / "src" / "web.rs",
}
# The console's groups need a session (of any role, an operator's or an
# admin's) or nothing (its files and the login): `docs/console.md`.
NEEDS = {
    "Management": "management", "Placement": "placement", "Service": "service", "Tenant": "tenant",
    "Public": "public", "Session": "session", "Operator": "operator", "Admin": "admin",
}
GROUP = re.compile(r"let\s+(?P<name>\w+)\s*=\s*(?:axum::)?Router::new\(\)")
GUARD = re.compile(r"guard\(\s*(?P<name>\w+)\s*,[^,]+,\s*Need::(?P<need>\w+)\s*\)")
MATRIX_ROW = re.compile(r"^\|\s*(?P<router>[\w-]+)\s*\|\s*`(?P<method>[A-Z]+)`\s*\|\s*`(?P<path>[^`]+)`\s*\|\s*(?P<need>\w+)\s*\|$")


def groups(source: str, where: str) -> dict[str, set[tuple[str, str]]]:
    """The routes of each `let NAME = Router::new()...;` of a router's source."""
    out = {}
    for m in GROUP.finditer(source):
        # The statement ends at the first `;` outside parentheses.
        i, depth = m.end(), 0
        while True:
            c = source[i]
            if c == '"':
                i = re.compile(r'"(?:\\.|[^"\\])*"').match(source, i).end()
                continue
            if c == "(":
                i = closing_paren(source, i) + 1
                continue
            if c == ";" and depth == 0:
                break
            i += 1
        # The group's own routes; their handlers are found in the whole file
        # (whose other routes are hidden from the reading).
        rest = source.replace(".route(", ".elsewhere(")
        out[m["name"]] = routes_in(source[m.start():i] + "\n" + rest, f"{where}: {m['name']}")
    return out


def guarded_routes(router: str) -> set[tuple[str, str, str]]:
    """(METHOD, path, need) of every route of `router`, each in exactly one
    guarded group; a route outside one fails."""
    path = ROUTERS[router]
    source = path.read_text()
    where = str(path.relative_to(REPO_ROOT))
    by_group = groups(source, where)
    needs = {m["name"]: m["need"] for m in GUARD.finditer(source)}
    every = routes_in(source, where)
    found = set()
    for name, routes in by_group.items():
        assert name in needs, f"{where}: routes {sorted(routes)} of `{name}` are under no token guard"
        assert needs[name] in NEEDS, f"{where}: Need::{needs[name]} is not a need this test knows"
        found |= {(method.upper(), p, NEEDS[needs[name]]) for p, method in routes}
    grouped = {(p, m.lower()) for m, p, _ in found}
    assert grouped == every, f"{where}: routes outside a guarded group: {sorted(every - grouped)}"
    return found


def matrix() -> set[tuple[str, str, str, str]]:
    """(router, METHOD, path, need) of every row of the matrix."""
    text = (REPO_ROOT / "docs" / "security.md").read_text()
    section = text.split("### Every HTTP route", 1)[1].split("\n#", 1)[0]
    rows = set()
    for line in section.splitlines():
        m = MATRIX_ROW.match(line.strip())
        if m:
            row = (m["router"], m["method"], m["path"], m["need"])
            assert row not in rows, f"docs/security.md: {row} twice"
            rows.add(row)
    assert len(rows) > 20, "the matrix's rows were read"
    return rows


def test_every_route_is_guarded_and_in_the_matrix_with_its_scope():
    code = {(router, *route) for router in ROUTERS for route in guarded_routes(router)}
    documented = matrix()
    assert not code - documented, "routes missing from docs/security.md (or with another need):\n" + \
        "\n".join(f"| {r} | `{m}` | `{p}` | {n} |" for r, m, p, n in sorted(code - documented))
    assert not documented - code, f"rows of docs/security.md that no router serves: {sorted(documented - code)}"


def test_the_reading_sees_an_unguarded_group():
    snippet = '''
    fn router(auth: Option<&HttpAuth>) -> Router {
        let open = Router::new().route("/v1/secret", get(secret));
        let service = Router::new().route("/metrics", get(metrics));
        Router::new().merge(open).merge(guard(service, auth, Need::Service))
    }
    async fn secret() {}
    async fn metrics() {}
    '''
    found = groups(snippet, "snippet")
    assert found == {"open": {("/v1/secret", "get")}, "service": {("/metrics", "get")}}
    needs = {m["name"]: m["need"] for m in GUARD.finditer(snippet)}
    assert "open" not in needs and needs["service"] == "Service"


def print_matrix() -> None:  # pragma: no cover - a helper for writing the document
    for router in ROUTERS:
        for method, path, need in sorted(guarded_routes(router), key=lambda r: (r[1], r[0])):
            print(f"| {router} | `{method}` | `{path}` | {need} |")


if __name__ == "__main__":
    print_matrix()
